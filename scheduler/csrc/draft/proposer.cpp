#include "draft/proposer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace lightspeed::draft {

namespace {
constexpr int32_t kCandidatesPerSource = 8;  // newest occurrences of an anchor looked at per source

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("DraftProposer: " + message);
}
}  // namespace

void ProposerConfig::validate() const {
  require(method == "ngram" || method == "suffix", "unknown method '" + method + "' (expected 'ngram' or 'suffix')");
  require(max_num_seqs >= 1, "max_num_seqs must be >= 1, got " + std::to_string(max_num_seqs));
  require(num_speculative_tokens >= 1 && num_speculative_tokens <= 64,
          "num_speculative_tokens must be in [1, 64], got " + std::to_string(num_speculative_tokens));
  require(min_match >= 1, "min_match must be >= 1, got " + std::to_string(min_match));
  require(max_match >= min_match, "max_match must be >= min_match (" + std::to_string(min_match) + "), got " +
                                      std::to_string(max_match));
  require(max_cached_requests >= 0, "max_cached_requests must be >= 0, got " + std::to_string(max_cached_requests));
  require(max_spec_factor > 0, "max_spec_factor must be > 0");
  require(min_token_prob >= 0 && min_token_prob <= 1, "min_token_prob must be in [0, 1]");
}

DraftProposer::DraftProposer(ProposerConfig config)
    : config_((config.validate(), std::move(config))), suffix_(config_.method == "suffix") {
  slots_.reserve(config_.max_num_seqs);
  for (int32_t i = 0; i < config_.max_num_seqs; ++i) slots_.push_back(Slot{TokenIndex(config_.min_match)});
  context_.reserve(config_.max_match + 64);
}

int32_t DraftProposer::check_slot(int32_t slot, const char* caller) const {
  if (slot < 0 || slot >= config_.max_num_seqs)
    throw std::invalid_argument(std::string("DraftProposer.") + caller + "(): slot " + std::to_string(slot) +
                                " is outside [0, " + std::to_string(config_.max_num_seqs) + ")");
  return slot;
}

void DraftProposer::start(int32_t slot, std::span<const int32_t> tokens, int32_t num_prompt_tokens, int64_t group) {
  Slot& s = slots_[check_slot(slot, "start")];
  if (num_prompt_tokens < 0 || num_prompt_tokens > static_cast<int32_t>(tokens.size()))
    throw std::invalid_argument("DraftProposer.start(): num_prompt_tokens is outside [0, len(tokens)]");
  s.index.clear();
  s.index.append(tokens);
  s.num_prompt_tokens = num_prompt_tokens;
  s.group = group;
  s.draft_length = config_.num_speculative_tokens;
  s.misses = s.backoff = s.cooldown = 0;
  s.bound = true;
}

void DraftProposer::commit(std::span<const int32_t> slots, std::span<const int32_t> tokens) {
  if (slots.size() != tokens.size()) throw std::invalid_argument("DraftProposer.commit(): slots and tokens differ in length");
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = slots_[check_slot(slots[i], "commit")];
    if (!s.bound) throw std::invalid_argument("DraftProposer.commit(): slot " + std::to_string(slots[i]) + " is not bound");
    s.index.append(tokens[i]);
    if (s.cooldown > 0) --s.cooldown;
  }
}

void DraftProposer::observe(std::span<const int32_t> slots, std::span<const int32_t> drafted,
                            std::span<const int32_t> accepted) {
  if (slots.size() != drafted.size() || slots.size() != accepted.size())
    throw std::invalid_argument("DraftProposer.observe(): slots, drafted and accepted differ in length");
  const int32_t most = config_.num_speculative_tokens;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (drafted[i] <= 0) continue;
    Slot& s = slots_[check_slot(slots[i], "observe")];
    s.draft_length = accepted[i] >= drafted[i] ? std::min(most, std::max(1, 2 * s.draft_length))
                                               : std::clamp(accepted[i] + 1, 1, most);
    if (accepted[i] > 0) {
      s.misses = s.backoff = 0;
    } else if (++s.misses >= kMissesBeforeBackoff) {
      s.backoff = s.backoff > 0 ? std::min(2 * s.backoff, kMaxBackoffTokens) : kFirstBackoffTokens;
      s.cooldown = s.backoff;
      s.misses = kMissesBeforeBackoff - 1;  // until a draft is accepted, one more miss backs off again
    }
  }
}

void DraftProposer::release(int32_t slot) {
  Slot& s = slots_[check_slot(slot, "release")];
  if (!s.bound) return;
  const auto& tokens = s.index.tokens();
  if (suffix_ && s.group >= 0 && config_.max_cached_requests > 0 && s.index.size() > s.num_prompt_tokens) {
    Cached cached{next_cached_id_++, s.group, TokenIndex(config_.min_match)};
    cached.index.append(std::span<const int32_t>(tokens).subspan(s.num_prompt_tokens));
    by_group_[s.group].push_back(cached.id);
    cache_order_.push_back(cached.id);
    cached_.emplace(cached.id, std::move(cached));
    while (static_cast<int32_t>(cached_.size()) > config_.max_cached_requests) {
      const int64_t oldest = cache_order_.front();
      cache_order_.pop_front();
      auto it = cached_.find(oldest);
      auto& members = by_group_[it->second.group];
      members.pop_front();  // FIFO overall is FIFO within each group
      if (members.empty()) by_group_.erase(it->second.group);
      cached_.erase(it);
    }
  }
  s.index.clear();
  s.bound = false;
  s.group = -1;
}

// Places in `source` whose preceding tokens match the context's tail for min_match or more.
void DraftProposer::collect(const TokenIndex& source, const int32_t* context, int32_t context_len, int32_t limit,
                            std::vector<Candidate>& found) const {
  const int32_t anchor = config_.min_match;
  const auto& src = source.tokens();
  int32_t end = source.latest_end(context + context_len - anchor);
  for (int32_t seen = 0; end > 0 && seen < kCandidatesPerSource; ++seen, end = source.previous_end(end)) {
    if (end >= limit) continue;  // nothing follows it (the tail itself)
    int32_t match = 0;
    while (match < config_.max_match && match < end && match < context_len &&
           src[end - 1 - match] == context[context_len - 1 - match])
      ++match;
    if (match >= anchor) found.push_back(Candidate{&source, end, match});
  }
}

int32_t DraftProposer::propose_one(const Slot& slot, std::span<const int32_t> pending, int32_t want, int32_t* out) const {
  const auto& own = slot.index.tokens();
  const auto committed = static_cast<int32_t>(own.size());
  const auto total = committed + static_cast<int32_t>(pending.size());
  if (want <= 0 || total < config_.min_match) return 0;
  // The context's tail: the last max_match tokens of (own tokens, pending drafts).
  const int32_t tail = std::min(total, config_.max_match);
  context_.clear();
  for (int32_t i = total - tail; i < total; ++i) context_.push_back(i < committed ? own[i] : pending[i - committed]);
  candidates_.clear();
  collect(slot.index, context_.data(), tail, total, candidates_);
  if (suffix_ && slot.group >= 0) {
    if (auto it = by_group_.find(slot.group); it != by_group_.end())
      for (auto id = it->second.rbegin(); id != it->second.rend(); ++id) {
        const TokenIndex& source = cached_.at(*id).index;
        collect(source, context_.data(), tail, source.size(), candidates_);
      }
  }
  if (candidates_.empty()) return 0;
  // Longest match first; among equals the earliest found, i.e. own tokens, newest first.
  const Candidate* best = &candidates_[0];
  for (const Candidate& c : candidates_)
    if (c.match > best->match) best = &c;
  auto token_at = [&](const Candidate& c, int32_t i) -> int32_t {
    const int32_t at = c.end + i;
    if (c.source != &slot.index) return at < c.source->size() ? c.source->tokens()[at] : -1;
    return at < committed ? own[at] : (at < total ? pending[at - committed] : -1);
  };
  if (suffix_) want = std::min(want, std::max(1, static_cast<int32_t>(std::floor(config_.max_spec_factor * best->match))));
  // Agreement of the other matching places with the proposal so far (suffix): one alive flag each.
  alive_.assign(suffix_ ? candidates_.size() : 0, 1);
  auto num_alive = static_cast<int32_t>(alive_.size());
  int32_t n = 0;
  for (; n < want; ++n) {
    const int32_t token = token_at(*best, n);
    if (token < 0) break;
    if (suffix_) {
      for (size_t c = 0; c < candidates_.size(); ++c)
        if (alive_[c] && token_at(candidates_[c], n) != token) alive_[c] = 0, --num_alive;
      if (num_alive < config_.min_token_prob * static_cast<double>(candidates_.size())) break;
    }
    out[n] = token;
  }
  return n;
}

void DraftProposer::propose(std::span<const int32_t> slots, std::span<const int32_t> extra,
                            std::span<const int32_t> pending_counts, std::span<const int32_t> pending_tokens,
                            int32_t pending_width, std::span<int32_t> out_tokens, int32_t out_width,
                            std::span<int32_t> out_counts) const {
  const size_t m = slots.size();
  if (extra.size() != m || pending_counts.size() != m || out_counts.size() != m)
    throw std::invalid_argument("DraftProposer.propose(): slots, extra, pending_counts and out_counts differ in length");
  if (pending_tokens.size() != m * static_cast<size_t>(pending_width) ||
      out_tokens.size() != m * static_cast<size_t>(out_width))
    throw std::invalid_argument("DraftProposer.propose(): token arrays must be [len(slots), width]");
  for (size_t i = 0; i < m; ++i) {
    const Slot& s = slots_[check_slot(slots[i], "propose")];
    if (!s.bound || pending_counts[i] < 0 || pending_counts[i] > pending_width) {
      out_counts[i] = 0;
      if (!s.bound) continue;
      throw std::invalid_argument("DraftProposer.propose(): pending_counts outside [0, pending width]");
    }
    const int32_t want = s.cooldown > 0 ? 0 : std::min(out_width, s.draft_length + std::max(0, extra[i]));
    const auto pending = pending_tokens.subspan(i * static_cast<size_t>(pending_width), pending_counts[i]);
    out_counts[i] = propose_one(s, pending, want, out_tokens.data() + i * static_cast<size_t>(out_width));
  }
}

}  // namespace lightspeed::draft
