#include "draft/token_index.h"

#include <stdexcept>

namespace lightspeed::draft {

TokenIndex::TokenIndex(int32_t anchor) : anchor_(anchor) {
  if (anchor < 1) throw std::invalid_argument("TokenIndex: anchor must be >= 1");
  clear();
}

void TokenIndex::clear() {
  tokens_.clear();
  previous_.clear();
  keys_.assign(64, 0);
  ends_.assign(64, -1);
  num_keys_ = 0;
}

uint64_t TokenIndex::hash(const int32_t* window, int32_t count) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t i = 0; i < count; ++i) {
    h ^= static_cast<uint32_t>(window[i]);
    h *= 0x100000001B3ull;
  }
  h ^= h >> 31;
  h *= 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  return h == 0 ? 1 : h;  // 0 marks an empty slot
}

int32_t TokenIndex::find(uint64_t key) const {
  const size_t mask = keys_.size() - 1;
  for (size_t i = key & mask;; i = (i + 1) & mask) {
    if (keys_[i] == key) return static_cast<int32_t>(i);
    if (keys_[i] == 0) return -static_cast<int32_t>(i) - 1;
  }
}

void TokenIndex::grow_table() {
  std::vector<uint64_t> old_keys(keys_.size() * 2, 0);
  std::vector<int32_t> old_ends(keys_.size() * 2, -1);
  old_keys.swap(keys_);
  old_ends.swap(ends_);
  const size_t mask = keys_.size() - 1;
  for (size_t j = 0; j < old_keys.size(); ++j) {
    if (old_keys[j] == 0) continue;
    size_t i = old_keys[j] & mask;
    while (keys_[i] != 0) i = (i + 1) & mask;
    keys_[i] = old_keys[j];
    ends_[i] = old_ends[j];
  }
}

void TokenIndex::append(int32_t token) {
  tokens_.push_back(token);
  previous_.push_back(-1);
  const auto end = static_cast<int32_t>(tokens_.size());
  if (end < anchor_) return;
  if (2 * (num_keys_ + 1) > keys_.size()) grow_table();
  const uint64_t key = hash(tokens_.data() + end - anchor_, anchor_);
  const int32_t at = find(key);
  if (at >= 0) {
    previous_[end - 1] = ends_[at];
    ends_[at] = end;
  } else {
    keys_[-at - 1] = key;
    ends_[-at - 1] = end;
    ++num_keys_;
  }
}

void TokenIndex::append(std::span<const int32_t> tokens) {
  tokens_.reserve(tokens_.size() + tokens.size());
  previous_.reserve(previous_.size() + tokens.size());
  for (int32_t token : tokens) append(token);
}

int32_t TokenIndex::latest_end(const int32_t* window) const {
  const int32_t at = find(hash(window, anchor_));
  return at >= 0 ? ends_[at] : -1;
}

}  // namespace lightspeed::draft
