// One token sequence with an index of its anchors: the n-grams of `anchor` tokens, each chained to
// the previous place it ended. Appending is O(anchor); the places an anchor ended are walked
// newest first, so the longest earlier match of a context's tail costs O(candidates * max_match).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lightspeed::draft {

class TokenIndex {
 public:
  explicit TokenIndex(int32_t anchor = 2);

  void clear();
  void append(int32_t token);
  void append(std::span<const int32_t> tokens);

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t anchor() const { return anchor_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }

  // End (exclusive) of the latest occurrence of the anchor `window` (anchor tokens), or -1.
  int32_t latest_end(const int32_t* window) const;
  // The occurrence ending before `end`, with the same anchor hash (callers compare tokens), or -1.
  int32_t previous_end(int32_t end) const { return previous_[end - 1]; }

  static uint64_t hash(const int32_t* window, int32_t count);

 private:
  void grow_table();
  int32_t find(uint64_t key) const;

  int32_t anchor_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> previous_;  // [size]: at end - 1, the previous end of that anchor, or -1
  // Open addressing, load <= 1/2: anchor hash (0 = empty) -> latest end.
  std::vector<uint64_t> keys_;
  std::vector<int32_t> ends_;
  size_t num_keys_ = 0;
};

}  // namespace lightspeed::draft
