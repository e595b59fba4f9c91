// CPU drafters for speculative decoding: prompt lookup ("ngram") and suffix matching ("suffix").
//
// Design note. Coding agents re-emit what their context already holds (files, diffs, tool
// output), so the next tokens are often a continuation of an earlier occurrence of the last few.
// Each request slot keeps its tokens (prompt + accepted outputs) in a TokenIndex. A proposal takes
// the tail of the slot's context (its tokens, then the drafts of its row still in flight), finds
// earlier places where that tail's anchor ended, extends each match backwards, and proposes what
// followed the best one (longest match, then most recent; prompt lookup caps the compared length
// at max_match, as vLLM's prompt_lookup_max does).
//   ngram:  the request's own tokens only; a match needs min_match tokens.
//   suffix: also the outputs of the last max_cached_requests finished requests of the same group
//           (a conversation), newest first; at most max_spec_factor * match-length drafts, and
//           drafting stops where fewer than min_token_prob of the matching places agree with the
//           proposal (their empirical next-token probability, as a suffix tree's counts give).
// Draft length adapts per slot to its acceptance history: all drafts accepted doubles it (up to
// num_speculative_tokens), a rejection sets it to the accepted length plus one.
// A slot whose drafts keep missing stops drafting for a while: two drafts in a row with nothing
// accepted start a back-off of kFirstBackoffTokens committed tokens, and each further miss right
// after one doubles it (up to kMaxBackoffTokens); any accepted draft ends it. A request whose
// output does not continue its context (prose, paraphrase) would otherwise verify a useless draft
// on most steps, which costs compute at high concurrency and on CPUs.
// Everything is O(k + candidates * max_match) per slot and step; start() indexes a prompt once.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "draft/token_index.h"

namespace lightspeed::draft {

struct ProposerConfig {
  std::string method = "ngram";        // "ngram" or "suffix"
  int32_t max_num_seqs = 256;          // slots
  int32_t num_speculative_tokens = 3;  // most drafts per step
  int32_t min_match = 3;               // shortest tail that counts as a match (the anchor length)
  int32_t max_match = 8;               // longest tail compared
  int32_t max_cached_requests = 1000;  // suffix: finished requests kept for matching
  double max_spec_factor = 1.0;        // suffix: drafts <= factor * match length
  double min_token_prob = 0.1;         // suffix: least agreement among matching places

  void validate() const;  // throws std::invalid_argument naming the field
};

class DraftProposer {
 public:
  explicit DraftProposer(ProposerConfig config);

  // Binds a slot to a request: its tokens so far (prompt, then outputs when a retracted request
  // returns), how many are prompt, and its group (-1: none).
  void start(int32_t slot, std::span<const int32_t> tokens, int32_t num_prompt_tokens, int64_t group);
  // Appends accepted tokens: tokens[i] to slots[i], in order.
  void commit(std::span<const int32_t> slots, std::span<const int32_t> tokens);
  // Acceptance history: slots[i] proposed drafted[i] drafts and accepted[i] of them.
  void observe(std::span<const int32_t> slots, std::span<const int32_t> drafted, std::span<const int32_t> accepted);
  // The request finished: with "suffix", its outputs join its group's cached requests.
  void release(int32_t slot);
  // For each slots[i]: a continuation of its tokens followed by pending_tokens row i (its first
  // pending_counts[i] entries, the drafts of its row in flight), of at most the slot's draft
  // length plus extra[i] tokens (1 when the first token stands for an in-flight sample). Writes
  // out_tokens row i ([n, width]) and out_counts[i].
  void propose(std::span<const int32_t> slots, std::span<const int32_t> extra, std::span<const int32_t> pending_counts,
               std::span<const int32_t> pending_tokens, int32_t pending_width, std::span<int32_t> out_tokens,
               int32_t out_width, std::span<int32_t> out_counts) const;

  const ProposerConfig& config() const { return config_; }
  int32_t draft_length(int32_t slot) const { return slots_.at(check_slot(slot, "draft_length")).draft_length; }
  // Committed tokens the slot still waits before it drafts again (0: it drafts).
  int32_t backoff_remaining(int32_t slot) const { return slots_.at(check_slot(slot, "backoff_remaining")).cooldown; }

  static constexpr int32_t kMissesBeforeBackoff = 2;
  static constexpr int32_t kFirstBackoffTokens = 4;
  static constexpr int32_t kMaxBackoffTokens = 64;
  int32_t num_cached_requests() const { return static_cast<int32_t>(cached_.size()); }

 private:
  struct Slot {
    TokenIndex index;
    int32_t num_prompt_tokens = 0;
    int64_t group = -1;
    int32_t draft_length = 0;
    int32_t misses = 0;    // drafts in a row with nothing accepted
    int32_t backoff = 0;   // length of the last back-off (0: none since the last accepted draft)
    int32_t cooldown = 0;  // committed tokens left in the current back-off
    bool bound = false;
  };
  struct Cached {
    int64_t id;
    int64_t group;
    TokenIndex index;
  };
  struct Candidate {
    const TokenIndex* source;
    int32_t end;    // the match ends here (exclusive): the proposal starts at tokens[end]
    int32_t match;  // matched tail length, capped at max_match
  };

  int32_t check_slot(int32_t slot, const char* caller) const;
  int32_t propose_one(const Slot& slot, std::span<const int32_t> pending, int32_t want, int32_t* out) const;
  void collect(const TokenIndex& source, const int32_t* context, int32_t context_len, int32_t limit,
               std::vector<Candidate>& found) const;

  ProposerConfig config_;
  bool suffix_;
  std::vector<Slot> slots_;
  std::deque<int64_t> cache_order_;                            // cached ids, oldest first
  std::unordered_map<int64_t, Cached> cached_;                 // id -> outputs of a finished request
  std::unordered_map<int64_t, std::deque<int64_t>> by_group_;  // group -> cached ids, oldest first
  int64_t next_cached_id_ = 0;
  mutable std::vector<int32_t> context_;                       // scratch: a slot's tail + pending
  mutable std::vector<Candidate> candidates_;                  // scratch
  mutable std::vector<uint8_t> alive_;                         // scratch: candidates agreeing so far
};

}  // namespace lightspeed::draft
