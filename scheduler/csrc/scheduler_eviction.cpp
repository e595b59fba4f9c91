// Eviction order of the prefix cache: least recently used, with the waiting queue's prefixes last.
//
// Design note (queue-aware eviction). The waiting queue is the one part of the future the scheduler
// knows: its requests are admitted in queue order, and each wants its cached prefix then. Plain LRU
// gets this backwards when a closed loop of conversations outgrows the cache. The conversation that
// has waited longest finished its last turn longest ago, so its prefix is the least recently used
// copy and is evicted just before that conversation is admitted, and every turn misses. Agentic
// c = 32 on an 80 GB H100 had a cached fraction of 0.107 against 0.966 ideal
// (bench/results/h100_vs_vllm_2026-12-07_1650/). So before a plan, once the cache has started to
// evict, the waiting requests' cached prefixes are touched from the back of the queue to the front.
// The next request to be admitted becomes the most recently used. Eviction then takes every copy no
// waiting request wants first (running requests' host copies, prefixes of finished conversations),
// and the queue's prefixes from its back: the copy wanted furthest in the future goes first, as in
// Belady's rule. The whole queue is ordered (up to kMaxProtected requests), not just as much of its
// front as the tiers hold: past that front, plain LRU would again evict the longest waiting first,
// the very order this exists to undo.
//
// The pages this plan's protection touched are also spared by the write-through's host eviction
// (scheduler_copies.cpp): a copy for the future use of a running request is not worth the prefix of
// a waiting one. Only this plan's stamps count (spare_epoch_), since older ones may mark requests
// admitted, finished or aborted since.
//
// Cost. A cache with room to spare needs no order, so a protection runs only after an eviction, or
// when the free pages could not hold the queue's prompts. Each request keeps its deepest matched
// node, so a protection walks up each path once and matches only when that node is gone or may
// have a deeper cached child (tools/bench/scheduler_eviction.py reports the scheduler's CPU per plan
// under each policy). Admission order itself stays as it was (priority, then
// arrival); SGLang's longest-prefix-first admission gets hits by letting cached conversations
// overtake the rest, which this does not do.
#include "scheduler.h"

namespace lightspeed {

void Scheduler::protect_waiting_prefixes() {
  spare_epoch_ = 0;  // nothing is spared unless this plan's protection runs
  if (!queue_eviction_ || waiting_.empty()) return;
  protect_order_.clear();
  int64_t wanted = 0;  // pages the protected prompts span
  for (int32_t record : waiting_) {
    if (protect_order_.size() == kMaxProtected) break;
    protect_order_.push_back(record);
    wanted += static_cast<int64_t>(records_[record].tokens.size()) / page_size_;
  }
  // Order matters only to an eviction: one since the last protection, or one that is near, since
  // the free pages could not hold what the queue wants.
  const int64_t evictions = cache_.num_evictions();
  const bool evicting = evictions != evictions_at_protect_;
  evictions_at_protect_ = evictions;
  if (!evicting && static_cast<int64_t>(device_.num_free()) + host_.num_free() >= wanted) return;
  if (++protect_epoch_ == 0) protect_epoch_ = 1;  // 0 means "spare nothing"
  spare_epoch_ = protect_epoch_;
  for (size_t i = protect_order_.size(); i-- > 0;) {
    Request& r = records_[protect_order_[i]];
    const int32_t max_pages = (static_cast<int32_t>(r.tokens.size()) - 1) / page_size_;
    if (r.protected_leaf >= 0) {
      const prefix::Node& leaf = cache_.node(r.protected_leaf);
      // Still the deepest cached page of the prompt, unless a child was cached under it since (another
      // request sharing the prefix finished its prefill, or a load landed): then match again.
      const bool deepest = leaf.num_children == 0 || leaf.depth == max_pages;
      if (leaf.alive && leaf.key == r.protected_key && deepest) {
        cache_.protect(r.protected_leaf, protect_epoch_);
        continue;
      }
    }
    cache_.match(r.tokens.data(), max_pages, protect_path_);
    r.protected_leaf = protect_path_.empty() ? -1 : protect_path_.back();
    if (r.protected_leaf < 0) continue;
    r.protected_key = cache_.node(r.protected_leaf).key;
    cache_.protect(r.protected_leaf, protect_epoch_);
  }
}

}  // namespace lightspeed
