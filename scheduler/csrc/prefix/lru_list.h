// Intrusive doubly linked LRU list over dense ids [0, n): O(1) touch and removal, no allocation.
#pragma once

#include <cstdint>
#include <vector>

namespace lightspeed::prefix {

class LruList {
 public:
  explicit LruList(int32_t n) : prev_(n + 1, -1), next_(n + 1, -1), sentinel_(n) {
    prev_[sentinel_] = next_[sentinel_] = sentinel_;
  }
  bool contains(int32_t id) const { return prev_[id] >= 0; }
  // Appends at the most recently used end (moving it there if present).
  void touch(int32_t id) {
    if (contains(id)) remove(id);
    const int32_t mru = prev_[sentinel_];
    prev_[id] = mru;
    next_[id] = sentinel_;
    next_[mru] = id;
    prev_[sentinel_] = id;
    ++size_;
  }
  void remove(int32_t id) {
    next_[prev_[id]] = next_[id];
    prev_[next_[id]] = prev_[id];
    prev_[id] = next_[id] = -1;
    --size_;
  }
  int32_t size() const { return size_; }
  // Iteration from least to most recently used: for (id = lru(); id != end(); id = next(id)).
  int32_t lru() const { return next_[sentinel_]; }
  int32_t next(int32_t id) const { return next_[id]; }
  int32_t end() const { return sentinel_; }

 private:
  std::vector<int32_t> prev_, next_;  // prev_[id] == -1 <=> id not in the list
  int32_t sentinel_;
  int32_t size_ = 0;
};

}  // namespace lightspeed::prefix
