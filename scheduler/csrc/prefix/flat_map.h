// Open-addressing hash map from a 64-bit page key to a node id, sized once: inserting and erasing
// never allocate, which keeps the scheduler's steady state free of heap traffic.
#pragma once

#include <cstdint>
#include <vector>

namespace lightspeed::prefix {

class FlatKeyMap {
 public:
  // Key 0 marks an empty slot; callers never use it (see page_key()).
  static constexpr uint64_t kEmpty = 0;

  explicit FlatKeyMap(size_t max_entries) {
    size_t capacity = 16;
    while (capacity < 2 * max_entries + 2) capacity <<= 1;  // load factor <= 1/2: short probes
    keys_.assign(capacity, kEmpty);
    values_.assign(capacity, -1);
    mask_ = capacity - 1;
  }

  int32_t find(uint64_t key) const {
    for (size_t i = key & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == kEmpty) return -1;
    }
  }

  // The key must be absent and the map below its max_entries.
  void insert(uint64_t key, int32_t value) {
    size_t i = key & mask_;
    while (keys_[i] != kEmpty) i = (i + 1) & mask_;
    keys_[i] = key;
    values_[i] = value;
    ++size_;
  }

  // Backward-shift deletion: no tombstones, so probe lengths do not degrade over time.
  void erase(uint64_t key) {
    size_t i = key & mask_;
    while (keys_[i] != key) {
      if (keys_[i] == kEmpty) return;
      i = (i + 1) & mask_;
    }
    for (size_t j = (i + 1) & mask_; keys_[j] != kEmpty; j = (j + 1) & mask_) {
      const size_t home = keys_[j] & mask_;
      // Move j into the hole at i when its home does not lie cyclically in (i, j].
      const bool home_in_range = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
      if (!home_in_range) {
        keys_[i] = keys_[j];
        values_[i] = values_[j];
        i = j;
      }
    }
    keys_[i] = kEmpty;
    values_[i] = -1;
    --size_;
  }

  size_t size() const { return size_; }

 private:
  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Chained page key: the hash of a page's tokens mixed with its parent's key, so equal keys imply
// (up to collisions, which token comparison catches) equal prefixes, not just equal pages.
inline uint64_t page_key(uint64_t parent_key, const int32_t* tokens, int32_t count) {
  uint64_t h = parent_key ^ 0x9E3779B97F4A7C15ull;
  for (int32_t i = 0; i < count; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 0x100000001B3ull;
    h ^= h >> 29;
  }
  // splitmix64 finaliser: spreads the low bits the table indexes on.
  h += 0x9E3779B97F4A7C15ull;
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h == FlatKeyMap::kEmpty ? 1 : h;
}

}  // namespace lightspeed::prefix
