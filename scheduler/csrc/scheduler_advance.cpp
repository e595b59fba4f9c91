// Consuming a plan: acknowledging its copies, appending sampled tokens, finishing requests.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "fsm/transitions.h"
#include "scheduler.h"

namespace lightspeed {

namespace {
int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }
bool contains(const std::vector<int32_t>& ids, int32_t token) {
  return std::find(ids.begin(), ids.end(), token) != ids.end();
}
}  // namespace

const std::vector<FinishedRequest>& Scheduler::advance(Plan& plan, std::span<const int32_t> sampled,
                                                       std::span<const int32_t> accepted_counts) {
  validate_advance(plan, sampled, accepted_counts);
  // Finished records stay readable (request_stats) until the advance() after the one reporting them.
  for (int32_t record : reclaim_) recycle(record);
  reclaim_.clear();
  finished_.clear();
  for (int64_t req_id : pending_abort_reports_) {
    finished_.push_back({req_id, fsm::FinishReason::kAbort});
    reclaim_.push_back(record_of_.at(req_id));
  }
  pending_abort_reports_.clear();
  if (!config_.async_copies && plan.has_copies) copies_done(plan.step_id);
  if (!config_.async_copies && plan.has_disk_ops) disk_done(plan.step_id);
  for (int32_t row = 0; row < plan.num_rows; ++row) {
    const int32_t accepted = row < plan.num_decodes && !accepted_counts.empty() ? accepted_counts[row] : 1;
    apply_row(plan, row, sampled, accepted);
  }
  plan.in_flight = false;
  --num_in_flight_;
  return finished_;
}

void Scheduler::validate_advance(const Plan& plan, std::span<const int32_t> sampled,
                                 std::span<const int32_t> accepted_counts) const {
  auto bad = [](const std::string& message) { throw std::invalid_argument("advance(): " + message); };
  if (&plan != plans_[0].get() && &plan != plans_[1].get()) bad("the plan belongs to another scheduler");
  if (!plan.in_flight) bad("plan " + std::to_string(plan.step_id) + " is not in flight (advanced twice?)");
  const int64_t oldest = next_step_ - num_in_flight_;
  if (plan.step_id != oldest)
    bad("plans must be advanced in order: expected step " + std::to_string(oldest) + ", got " +
        std::to_string(plan.step_id));
  if (static_cast<int64_t>(sampled.size()) != plan.num_samples)
    bad("expected " + std::to_string(plan.num_samples) + " sampled token ids (one per logits_indices entry), got " +
        std::to_string(sampled.size()));
  for (int32_t token : sampled)
    if (token < 0) bad("negative sampled token id " + std::to_string(token));
  if (accepted_counts.empty()) {
    for (int32_t row = 0; row < plan.num_decodes; ++row)
      if (plan.rows[row].num_samples > 1)
        bad("the plan has speculative decode rows: pass accepted_counts[num_decodes]");
    return;
  }
  if (static_cast<int64_t>(accepted_counts.size()) != plan.num_decodes)
    bad("expected " + std::to_string(plan.num_decodes) + " accepted_counts (one per decode row), got " +
        std::to_string(accepted_counts.size()));
  for (int32_t row = 0; row < plan.num_decodes; ++row) {
    const int32_t accepted = accepted_counts[row];
    if (accepted < 1 || accepted > plan.rows[row].num_samples)
      bad("accepted_counts[" + std::to_string(row) + "]=" + std::to_string(accepted) + " is outside [1, " +
          std::to_string(plan.rows[row].num_samples) + "]");
  }
}

void Scheduler::apply_row(Plan& plan, int32_t row, std::span<const int32_t> sampled, int32_t accepted) {
  const PlanRow& info = plan.rows[row];
  plan.appended_counts[row] = 0;
  const int32_t record = slot_record_[plan.req_slots[row]];
  // A request that finished or was aborted after this plan was built loses its row.
  if (record < 0 || records_[record].req_id != plan.req_ids[row]) return;
  Request& r = records_[record];
  const int32_t kv_end = info.kv_start + info.num_tokens;
  if (info.num_samples == 0) {
    // A mid-prompt chunk is done: share its full pages now, so that concurrent requests with the
    // same long prompt reuse it while this one is still running.
    if (auto* prefilling = std::get_if<fsm::Prefilling>(&r.state))
      insert_into_cache(r, prefilling->device_pages, kv_end);
    return;
  }
  --r.pending_samples;
  fsm::FinishReason reason = fsm::FinishReason::kStop;
  bool done = false;
  int32_t appended = 0;
  while (appended < accepted && !done) done = append_token(r, sampled[info.sample_begin + appended++], &reason);
  plan.appended_counts[row] = appended;
  settle_kv(plan, info, r, accepted);
  if (auto* decoding = std::get_if<fsm::Decoding>(&r.state))
    if (row >= plan.num_decodes) insert_into_cache(r, decoding->device_pages, kv_end);  // prompt completed
  if (done) finish(record, reason);
}

// The KV of a row's accepted prefix stays; its rejected draft tail is void. With a later row in
// flight (overlap), that row was planned as if this one accepted everything: the request's KV end
// moves down by the rejected drafts now, and that row's advance() learns its true start from
// pending_shift. Pages are given back only once no later row needs them.
void Scheduler::settle_kv(const Plan& plan, const PlanRow& info, Request& r, int32_t accepted) {
  const int32_t shift = info.provisional ? std::exchange(r.pending_shift, 0) : 0;
  auto* decoding = std::get_if<fsm::Decoding>(&r.state);
  if (decoding == nullptr || info.num_samples <= 1) return;  // retracted meanwhile (it saved only known KV)
  const int32_t rejected = info.num_samples - accepted;
  if (r.scheduled_step > plan.step_id) {
    decoding->kv_len -= rejected;
    r.pending_shift = rejected;
    return;
  }
  decoding->kv_len = info.kv_start - shift + accepted;
  const auto keep = static_cast<size_t>(ceil_div(decoding->kv_len, page_size_));
  if (decoding->device_pages.size() > keep) {
    decoding->device_pages.truncate(keep);
    ++r.page_epoch;
  }
}

bool Scheduler::append_token(Request& r, int32_t token, fsm::FinishReason* reason) const {
  r.tokens.push_back(token);
  if ((!r.ignore_eos && contains(r.eos_token_ids, token)) || contains(r.stop_token_ids, token)) {
    *reason = fsm::FinishReason::kStop;
    return true;
  }
  if (r.num_output_tokens() >= r.max_new_tokens || static_cast<int32_t>(r.tokens.size()) >= config_.max_model_len) {
    *reason = fsm::FinishReason::kLength;
    return true;
  }
  return false;
}

// Releases the request. A decode's full pages go to the prefix cache, which writes them through
// to host in the background (see scheduler_copies.cpp): the request itself owns nothing after this.
void Scheduler::finish(int32_t record, fsm::FinishReason reason) {
  Request& r = records_[record];
  finished_.push_back({r.req_id, reason});
  release_slot(r);
  live_rids_.erase(r.rid);
  if (auto* decoding = std::get_if<fsm::Decoding>(&r.state)) {
    erase_from(running_, record);
    insert_into_cache(r, decoding->device_pages,
                      std::min(decoding->kv_len, static_cast<int32_t>(r.tokens.size()) - 1));
    // Prefix pages that missed their write-through (host full then, or a device hit whose host
    // copy was evicted since) get another chance: the next turn of this conversation reads them.
    for (int32_t node : r.cache_path) queue_write_through(node);
    r.state = fsm::finish(std::move(*decoding), reason);
  } else {
    // Retracted while its last sample was in flight (overlap).
    erase_from(retracted_, record);
    erase_from(waiting_, record);
    hold_for_copy(r);  // a Retracting copy may still be writing its host pages
    std::visit(
        [&](auto&& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<S, fsm::Retracting> || std::is_same_v<S, fsm::Retracted> ||
                        std::is_same_v<S, fsm::Waiting>)
            r.state = fsm::finish(std::move(s), reason);
          else
            throw std::logic_error(std::string("finish() from state ") + fsm::state_name(r.state));
        },
        std::move(r.state));
  }
  reclaim_.push_back(record);
}

void Scheduler::insert_into_cache(Request& r, kv::PageList& pages, int32_t num_valid_tokens) {
  if (!config_.enable_prefix_cache) return;
  const int32_t full = std::min(num_valid_tokens / page_size_, static_cast<int32_t>(pages.size()));
  for (auto i = static_cast<int32_t>(r.cache_path.size()); i < full; ++i) {
    const int32_t parent = i == 0 ? prefix::RadixCache::kRoot : r.cache_path[i - 1];
    int32_t cached_page = -1;
    const int32_t node = cache_.insert(parent, r.tokens.data() + static_cast<ptrdiff_t>(i) * page_size_, pages[i],
                                       &cached_page);
    if (node < 0) return;  // hash collision: the rest of this request stays private
    if (cached_page != pages[i]) {
      pages.replace(i, cached_page);  // an identical page is cached already: share it, free ours
      ++r.page_epoch;
    }
    r.cache_path.push_back(node);
    queue_write_through(node);
  }
  if (!r.cache_path.empty()) cache_.touch(r.cache_path.back(), r.retention);  // leaf first, ancestors after
}

}  // namespace lightspeed
