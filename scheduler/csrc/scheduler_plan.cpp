// Building a plan: the batching policy, admission, page growth and retraction.
//
// Design note (decode-first mixed batching). Every running decode gets its 1 (or 1 + k draft)
// tokens first, so tokens/s per user stays steady while long prompts stream in; whatever is left
// of max_num_batched_tokens goes to prefill chunks, by priority then arrival: first requests
// already prefilling, then retracted requests (their KV is loaded back from host), then new ones.
// A decode that needs a page and finds none evicts unreferenced prefix-cache pages, then retracts
// the lowest-priority, latest-arrived running request not yet placed in this plan (possibly
// itself). Prefills never retract decodes: they shrink their chunk or wait. The prefill-first
// policy runs a step of prefill chunks whenever there is one to run, and decodes otherwise.
//
// Design note (speculative rows under overlap). A decode row may carry k draft tokens, k chosen
// per step by the drafter (DraftInput). While its row of step N is in flight the request's KV
// end counts all of N's drafts as accepted, and its row in step N+1 is planned from there
// (PlanRow::provisional): pages are reserved for that worst case, and the engine moves the row's
// positions, slots, seq_len and deferred input down on the device by the drafts N rejected. So a
// speculative request keeps a row every step; advance(N) learns the shift and advance(N+1)
// applies it to the scheduler's own bookkeeping.
#include <algorithm>
#include <cassert>
#include <stdexcept>

#include "fsm/transitions.h"
#include "scheduler.h"

namespace lightspeed {

namespace {
int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

kv::PageList& device_pages_of(fsm::RequestState& state) {
  return std::visit(
      [](auto& s) -> kv::PageList& {
        if constexpr (requires { s.device_pages; }) {
          return s.device_pages;
        } else {
          throw std::logic_error("request state owns no device pages");
        }
      },
      state);
}
}  // namespace

void Scheduler::validate_drafts(const DraftInput& drafts) const {
  auto bad = [](const std::string& message) { throw std::invalid_argument("next_plan(): " + message); };
  const auto slots = static_cast<size_t>(config_.num_slots());
  if (drafts.counts.empty()) {
    if (!drafts.tokens.empty()) bad("draft token ids need draft counts");
    return;
  }
  if (drafts.counts.size() != slots)
    bad("expected " + std::to_string(slots) + " draft counts (one per slot), got " +
        std::to_string(drafts.counts.size()));
  int32_t widest = 0;
  for (int32_t count : drafts.counts) {
    if (count < 0 || count > config_.max_num_draft_tokens)
      bad("draft count " + std::to_string(count) + " is outside [0, " +
          std::to_string(config_.max_num_draft_tokens) + "]");
    widest = std::max(widest, count);
  }
  if (drafts.tokens.empty()) return;
  if (drafts.width < widest || drafts.tokens.size() != slots * static_cast<size_t>(drafts.width))
    bad("draft token ids must be [" + std::to_string(slots) + ", width >= " + std::to_string(widest) + "]");
  for (int32_t token : drafts.tokens)
    if (token < 0) bad("negative draft token id " + std::to_string(token));
}

Plan& Scheduler::next_plan(const DraftInput& drafts) {
  if (num_in_flight_ >= 2)
    throw std::invalid_argument("next_plan(): two plans are in flight; advance() the older one first");
  validate_drafts(drafts);
  Plan& plan = *plans_[next_step_ % 2];
  plan.reset(next_step_++);
  device_.begin_quarantine();
  protect_waiting_prefixes();  // before this plan's evictions (scheduler_eviction.cpp)
  emit_write_through(plan);
  emit_disk_writes(plan);

  Budget budget{config_.max_num_batched_tokens, config_.max_num_seqs};
  num_finishing_ = count_finishing(plan.step_id - 1);
  if (policy_ == Policy::kPrefillFirst) {
    schedule_prefills(plan, budget);
    if (plan.num_rows == 0) schedule_decodes(plan, budget, drafts);
  } else {
    schedule_decodes(plan, budget, drafts);
    schedule_prefills(plan, budget);
  }
  device_.end_quarantine();
  finalize(plan);
  seal_copies(plan);
  plan.in_flight = true;
  ++num_in_flight_;
  return plan;
}

void Scheduler::schedule_decodes(Plan& plan, Budget& budget, const DraftInput& drafts) {
  const int64_t in_flight_step = plan.step_id - 1;  // the plan whose samples may still be pending
  const int32_t max_len = config_.max_model_len;
  // A snapshot: retraction reorders running_ while we walk it.
  order_.assign(running_.begin(), running_.end());
  for (const int32_t record : order_) {
    Request& r = records_[record];
    auto* decoding = std::get_if<fsm::Decoding>(&r.state);
    if (decoding == nullptr) continue;  // prefilling, or retracted by an earlier row
    const auto known = static_cast<int32_t>(r.tokens.size());
    const bool deferred = decoding->kv_len >= known;
    int32_t outputs_before = r.num_output_tokens();
    if (deferred) {
      // Overlap: the input is the in-flight plan's (last) sample, and kv_len counts all of that
      // row's drafts as accepted. A request sure to hit a limit with one more token runs no more.
      if (decoding->kv_len != known + r.last_row_drafts || r.last_sample_step != in_flight_step ||
          hits_limit_with_next_token(r) || decoding->kv_len >= max_len)
        continue;
      outputs_before += 1 + r.last_row_drafts;
    }
    const int32_t wanted = drafts.counts.empty() ? r.num_draft_tokens : drafts.counts[r.slot];
    // Draft slots stop at max_model_len (positions past it do not exist for the model) and where
    // the output limit would end the request even if every draft were accepted.
    const int32_t num_drafts =
        std::max(0, std::min({wanted, max_len - decoding->kv_len - 1, r.max_new_tokens - outputs_before - 1}));
    const int32_t num_tokens = 1 + num_drafts;
    if (num_tokens > budget.tokens || budget.rows == 0) break;
    const int32_t kv_end = decoding->kv_len + num_tokens;
    const int32_t lookahead = std::max(0, std::min(config_.num_lookahead_tokens, max_len - kv_end));
    if (!grow_pages(plan, record, decoding->device_pages, kv_end + lookahead, true)) continue;
    const int32_t kv_start = decoding->kv_len;
    decoding->kv_len = kv_end;
    const int32_t* draft_tokens =
        drafts.tokens.empty() ? nullptr : drafts.tokens.data() + static_cast<size_t>(r.slot) * drafts.width;
    emit_row(plan, r, decoding->device_pages, kv_start, num_tokens, num_tokens, draft_tokens, lookahead,
             deferred && r.last_row_drafts > 0);
    ++plan.num_decodes;
    plan.num_decode_tokens += num_tokens;
    budget.tokens -= num_tokens;
    --budget.rows;
  }
}

bool Scheduler::hits_limit_with_next_token(const Request& r) const {
  return r.num_output_tokens() + 1 >= r.max_new_tokens ||
         static_cast<int32_t>(r.tokens.size()) + 1 >= config_.max_model_len;
}

// Decoding requests whose sample in the plan in flight is their last: advance() will finish them
// whatever that sample is (the output or length limit, not a stop token).
int32_t Scheduler::count_finishing(int64_t in_flight_step) const {
  if (num_in_flight_ == 0 || config_.num_spare_slots == 0) return 0;
  int32_t n = 0;
  for (const int32_t record : running_) {
    const Request& r = records_[record];
    const auto* decoding = std::get_if<fsm::Decoding>(&r.state);
    if (decoding != nullptr && r.last_sample_step == in_flight_step &&
        decoding->kv_len >= static_cast<int32_t>(r.tokens.size()) && hits_limit_with_next_token(r))
      ++n;
  }
  return n;
}

// A slot for a request that has none: a free one, while the requests holding slots, less those the
// plan in flight finishes, stay under max_num_seqs (spare slots stand in for the finishing ones').
bool Scheduler::slot_for_new_request() const {
  if (free_slots_.empty()) return false;
  const auto held = config_.num_slots() - static_cast<int32_t>(free_slots_.size());
  return held - num_finishing_ < config_.max_num_seqs;
}

void Scheduler::schedule_prefills(Plan& plan, Budget& budget) {
  order_.assign(running_.begin(), running_.end());
  for (const int32_t record : order_) {
    if (budget.tokens <= 0 || budget.rows <= 0) break;
    if (!std::holds_alternative<fsm::Prefilling>(records_[record].state)) continue;
    if (records_[record].scheduled_step == plan.step_id) continue;
    if (!schedule_chunk(plan, budget, record)) break;
  }
  load_landed(plan);
  readmit_retracted(plan);
  admit_waiting(plan, budget);
}

bool Scheduler::schedule_chunk(Plan& plan, Budget& budget, int32_t record) {
  Request& r = records_[record];
  auto& prefilling = std::get<fsm::Prefilling>(r.state);
  const auto total = static_cast<int32_t>(r.tokens.size());
  int32_t chunk = std::min({total - prefilling.num_computed, config_.chunked_prefill_size, budget.tokens});
  if (chunk <= 0 || budget.rows == 0) return false;
  if (!grow_pages(plan, record, prefilling.device_pages, prefilling.num_computed + chunk, false)) {
    // Short of pages: run what the pages it got can hold.
    chunk = static_cast<int32_t>(prefilling.device_pages.size()) * page_size_ - prefilling.num_computed;
    chunk = std::min(chunk, total - prefilling.num_computed);
    if (chunk <= 0) return false;
  }
  const int32_t kv_start = prefilling.num_computed;
  const bool completes = kv_start + chunk == total;
  fsm::assign(r.state, fsm::chunk_scheduled(std::move(prefilling), chunk, total));
  emit_row(plan, r, device_pages_of(r.state), kv_start, chunk, completes ? 1 : 0);
  ++plan.num_prefills;
  budget.tokens -= chunk;
  --budget.rows;
  return true;
}

// Allocates device pages until `pages` covers num_tokens. Falls back on evicting the prefix cache,
// then on retracting requests later in scheduling order. Returns false when it could not (then
// `record` itself may have been retracted when may_retract_decodes is set).
bool Scheduler::grow_pages(Plan& plan, int32_t record, kv::PageList& pages, int32_t num_tokens,
                           bool may_retract_decodes) {
  int32_t missing = ceil_div(num_tokens, page_size_) - static_cast<int32_t>(pages.size());
  while (missing > 0) {
    const int32_t page = device_.allocate_for_forward();
    if (page >= 0) {
      pages.push_owned(page);
      --missing;
      continue;
    }
    if (cache_.evict_device(missing) > 0) continue;
    if (!retract_victim(plan, record, may_retract_decodes)) return false;
    const fsm::RequestState& state = records_[record].state;
    if (!std::holds_alternative<fsm::Decoding>(state) && !std::holds_alternative<fsm::Prefilling>(state))
      return false;  // it retracted itself: `pages` is gone
  }
  return true;
}

// Retracts the last running request in scheduling order that has no row in this plan. A decode
// may pick any such request, itself included; a prefill only a later prefilling request.
bool Scheduler::retract_victim(Plan& plan, int32_t record, bool decodes_too) {
  for (size_t i = running_.size(); i-- > 0;) {
    const int32_t victim = running_[i];
    if (victim == record && !decodes_too) return false;
    if (records_[victim].scheduled_step == plan.step_id) continue;
    if (!decodes_too && !std::holds_alternative<fsm::Prefilling>(records_[victim].state)) continue;
    retract(plan, victim);
    return true;
  }
  return false;
}

void Scheduler::retract(Plan& plan, int32_t record) {
  Request& r = records_[record];
  erase_from(running_, record);
  ++num_retractions_;
  ++r.page_epoch;
  kv::PageList& pages = device_pages_of(r.state);
  // Only KV of known tokens is sure to be valid: a row in flight may still reject its drafts.
  const int32_t kv_len = std::min(static_cast<int32_t>(r.tokens.size()),
                                  std::visit(
                                      [](const auto& s) -> int32_t {
                                        if constexpr (requires { s.kv_len; }) return s.kv_len;
                                        else if constexpr (requires { s.num_computed; }) return s.num_computed;
                                        else return 0;
                                      },
                                      r.state));
  const int32_t num_pages = ceil_div(kv_len, page_size_);
  if (kv_len > 0 && host_.num_free() < num_pages) cache_.evict_host(num_pages - host_.num_free());
  if (kv_len > 0 && host_.num_free() >= num_pages) {
    kv::PageList host_pages(host_, num_pages);
    for (int32_t i = 0; i < num_pages; ++i) {
      const int32_t host_page = host_.allocate();
      host_pages.push_owned(host_page);
      plan.write_back.push_back(pages[i]);
      plan.write_back.push_back(host_page);
    }
    r.cache_path.clear();
    std::visit(
        [&](auto&& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<S, fsm::Prefilling> || std::is_same_v<S, fsm::Decoding>)
            r.state = fsm::retract_to_host(std::move(s), std::move(host_pages), kv_len);
        },
        std::move(r.state));
    building_.waiters.push_back(r.req_id);
    r.copy_step = plan.step_id;
    plan.forward_waits_for_copies = true;  // this plan's forward may reuse the pages being read
    insert_sorted(retracted_, record);
    return;
  }
  // No room on host: drop the KV, but leave its full pages to the prefix cache so that the
  // recompute may still hit them.
  insert_into_cache(r, pages, kv_len);
  r.cache_path.clear();
  std::visit(
      [&](auto&& s) {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, fsm::Prefilling> || std::is_same_v<S, fsm::Decoding>)
          r.state = fsm::retract_drop(std::move(s));
      },
      std::move(r.state));
  insert_sorted(waiting_, record);
}

// Device pages for host->device copies must not come from the quarantine (see PagePool).
bool Scheduler::ensure_device_free(int32_t pages, bool for_copy) {
  auto available = [&] { return for_copy ? device_.num_free_unquarantined() : device_.num_free(); };
  if (available() < pages) cache_.evict_device(pages - available());
  return available() >= pages;
}

void Scheduler::readmit_retracted(Plan& plan) {
  for (size_t i = 0; i < retracted_.size();) {
    const int32_t record = retracted_[i];
    Request& r = records_[record];
    auto* retracted = std::get_if<fsm::Retracted>(&r.state);
    if (retracted == nullptr || r.pending_samples > 0) {
      ++i;
      continue;
    }
    const auto num_pages = static_cast<int32_t>(retracted->host_pages.size());
    // Room for its KV plus the page its next token needs; otherwise it keeps its place in line.
    if (!ensure_device_free(num_pages + 1, true)) break;
    kv::PageList device_pages(device_, max_pages_per_seq_);
    for (int32_t p = 0; p < num_pages; ++p) {
      const int32_t page = device_.allocate();
      device_pages.push_owned(page);
      plan.load_back.push_back(retracted->host_pages[p]);
      plan.load_back.push_back(page);
    }
    ++r.page_epoch;
    r.state = fsm::readmit(std::move(*retracted), std::move(device_pages));
    building_.waiters.push_back(r.req_id);
    r.copy_step = plan.step_id;
    retracted_.erase(retracted_.begin() + static_cast<ptrdiff_t>(i));
    loading_.push_back(record);
  }
}

void Scheduler::admit_waiting(Plan& plan, Budget& budget) {
  for (size_t i = 0; i < waiting_.size();) {
    if (budget.rows <= 0 || budget.tokens <= 0) break;
    const int32_t record = waiting_[i];
    Request& r = records_[record];
    if (r.pending_samples > 0) {  // dropped while its last sample is in flight
      ++i;
      continue;
    }
    if (r.slot < 0 && !slot_for_new_request()) break;
    const int32_t capacity = device_.num_free() + cache_.num_unreferenced_device();
    if (r.req_id == blocked_req_id_ && capacity <= blocked_capacity_) break;
    const auto known = static_cast<int32_t>(r.tokens.size());
    // At least the last known token is computed: its logits give the next token.
    prefix::MatchResult match;
    match_path_.clear();
    if (config_.enable_prefix_cache) match = cache_.match(r.tokens.data(), (known - 1) / page_size_, match_path_, r.retention);
    kv::PageList device_pages(device_, max_pages_per_seq_);
    kv::PageList host_pins(host_, match.num_host + match.num_disk);
    for (int32_t k = 0; k < match.num_device; ++k) device_pages.push_shared(cache_.node(match_path_[k]).device_page);
    for (int32_t k = match.num_device; k < match.num_device + match.num_host; ++k)
      host_pins.push_shared(cache_.node(match_path_[k]).host_page);
    // Admission control: room for the whole prompt now, so admitted prompts rarely retract others
    // to finish. Strict order: a request that does not fit holds back those behind it.
    const int32_t pages_needed = ceil_div(known + 1, page_size_) - match.num_device;
    if (!ensure_device_free(pages_needed, false)) {
      blocked_req_id_ = r.req_id;
      blocked_capacity_ = capacity;
      break;
    }
    // Copy targets cannot come from pages this plan freed; those are free again next step.
    if (!ensure_device_free(match.num_host, true)) break;
    blocked_req_id_ = -1;
    // Disk hits are read into host pages of the request's own: as many as host memory gives.
    if (match.num_disk > 0) match.num_disk = reserve_disk_reads(match.num_disk, host_pins);
    waiting_.erase(waiting_.begin() + static_cast<ptrdiff_t>(i));
    start(plan, budget, record, match, std::move(device_pages), std::move(host_pins));
  }
}

// Admits a request whose pages are secured: it reads its disk hits first (ReadingDisk), loads its
// host hits first (LoadingPrefix), or starts computing the rest of its prompt in this very plan
// (Prefilling).
void Scheduler::start(Plan& plan, Budget& budget, int32_t record, prefix::MatchResult match,
                      kv::PageList device_pages, kv::PageList host_pins) {
  Request& r = records_[record];
  r.protected_leaf = -1;  // admitted: should it wait again (retracted), its prefix is matched afresh
  if (r.slot < 0) {
    r.slot = free_slots_.back();
    free_slots_.pop_back();
    slot_record_[r.slot] = record;
  }
  const int32_t cached_tokens = (match.num_device + match.num_host + match.num_disk) * page_size_;
  if (!r.admitted_once) {
    r.admitted_once = true;
    r.num_cached_tokens = cached_tokens;
    const int32_t by_tier[3] = {match.num_device, match.num_host, match.num_disk};
    for (int tier = 0; tier < 3; ++tier) {
      r.cached_pages_by_tier[tier] = by_tier[tier];
      hit_tokens_by_tier_[tier] += static_cast<int64_t>(by_tier[tier]) * page_size_;
    }
    r.disk_hit_counted = match.num_disk > 0;
    prefix_hit_tokens_ += cached_tokens;
    prefix_query_tokens_ += r.num_prompt_tokens;
  }
  // The disk part is not the cache's on device: the request inserts those pages once they are loaded.
  r.cache_path.assign(match_path_.begin(), match_path_.begin() + match.num_device + match.num_host);
  ++r.page_epoch;
  if (match.num_host > 0 || match.num_disk > 0) {
    for (int32_t k = match.num_device; k < match.num_device + match.num_host; ++k) {
      const int32_t node = match_path_[k];
      const int32_t page = device_.allocate();
      device_pages.push_owned(page);
      cache_.attach_device(node, page, /*loading=*/true);
      building_.load_nodes.push_back(node);
      plan.load_back.push_back(cache_.node(node).host_page);
      plan.load_back.push_back(page);
    }
    if (match.num_disk > 0)
      return read_from_disk(plan, record, match, std::move(device_pages), std::move(host_pins), cached_tokens);
    r.state = fsm::admit_loading(std::get<fsm::Waiting>(std::move(r.state)), std::move(device_pages),
                                 std::move(host_pins), cached_tokens);
    loading_.push_back(record);
    building_.waiters.push_back(r.req_id);
    r.copy_step = plan.step_id;
    return;
  }
  r.state = fsm::admit(std::get<fsm::Waiting>(std::move(r.state)), std::move(device_pages), cached_tokens);
  insert_sorted(running_, record);
  schedule_chunk(plan, budget, record);
}

void Scheduler::emit_row(Plan& plan, Request& r, const kv::PageList& pages, int32_t kv_start, int32_t num_tokens,
                         int32_t num_samples, const int32_t* draft_tokens, int32_t lookahead, bool provisional) {
  const int32_t row = plan.num_rows++;
  const int32_t first_token = plan.num_tokens;
  const int32_t first_sample = plan.num_samples;
  const auto known = static_cast<int32_t>(r.tokens.size());
  const int32_t* page_ids = pages.pages().data();
  plan.req_ids[row] = r.req_id;
  plan.req_slots[row] = r.slot;
  plan.query_start_loc[row] = first_token;
  plan.cached_lens[row] = kv_start;
  plan.seq_lens[row] = kv_start + num_tokens;
  for (int32_t j = 0; j < num_tokens; ++j) {
    const int32_t pos = kv_start + j;
    const int32_t t = first_token + j;
    plan.positions[t] = pos;
    plan.slot_mapping[t] = static_cast<int64_t>(page_ids[pos / page_size_]) * page_size_ + pos % page_size_;
    // Unknown inputs: the first is the in-flight plan's sample (overlap); later ones are draft
    // slots, which hold the drafter's tokens in order (row token j holds draft j - 1).
    const bool known_input = pos < known;
    const bool deferred = !known_input && j == 0;
    const int32_t draft = !known_input && j > 0 && draft_tokens != nullptr ? draft_tokens[j - 1] : 0;
    plan.input_ids[t] = known_input ? r.tokens[pos] : draft;
    plan.deferred_input_mask[t] = deferred;
    plan.deferred_src_index[t] = deferred ? r.last_sample_index : -1;
  }
  for (int32_t j = 0; j < num_samples; ++j) {
    plan.logits_indices[first_sample + j] = first_token + num_tokens - num_samples + j;
    plan.sample_batch_rows[first_sample + j] = row;
  }
  plan.rows[row] = PlanRow{kv_start, num_tokens, first_sample, num_samples, r.page_epoch, lookahead, provisional};
  plan.row_pages[row] = &pages;
  plan.num_tokens += num_tokens;
  plan.num_samples += num_samples;
  plan.max_query_len = std::max(plan.max_query_len, num_tokens);
  r.scheduled_step = plan.step_id;
  r.last_row_drafts = std::max(0, num_samples - 1);
  if (num_samples > 0) {
    ++r.pending_samples;
    r.last_sample_step = plan.step_id;
    r.last_sample_index = first_sample + num_samples - 1;
  }
}

// Writes page_table[B, P]. Rows persist in the buffer between its plans: a row that holds the
// same request with the same page epoch and width only gets its new tail pages, so a steady
// decode batch costs O(B) here rather than O(B * P).
void Scheduler::finalize(Plan& plan) {
  const int32_t num_rows = plan.num_rows;
  plan.query_start_loc[num_rows] = plan.num_tokens;
  // A row's table covers its KV after this step plus its lookahead (pages it holds for them).
  auto row_width = [&](int32_t b) {
    const auto held = static_cast<int32_t>(plan.row_pages[b]->size());
    return std::min(held, ceil_div(plan.seq_lens[b] + plan.rows[b].lookahead, page_size_));
  };
  int32_t width = 0;
  for (int32_t b = 0; b < num_rows; ++b) width = std::max(width, row_width(b));
  plan.pages_per_row = width;
  if (width != plan.table_width) {
    std::fill(plan.table_row_owner.begin(), plan.table_row_owner.end(), -1);
    plan.table_width = width;
  }
  for (int32_t b = 0; b < num_rows; ++b) {
    const int32_t n = row_width(b);
    int32_t* row = plan.page_table.data() + static_cast<size_t>(b) * width;
    const int32_t* src = plan.row_pages[b]->pages().data();
    const bool reuse = plan.table_row_owner[b] == plan.req_ids[b] && plan.table_row_epoch[b] == plan.rows[b].page_epoch;
    const int32_t start = reuse ? std::min(plan.table_row_pages[b], n) : 0;
    std::copy(src + start, src + n, row + start);
    const int32_t stale_end = reuse ? std::max(plan.table_row_pages[b], n) : width;
    std::fill(row + n, row + stale_end, 0);
    plan.table_row_owner[b] = plan.req_ids[b];
    plan.table_row_epoch[b] = plan.rows[b].page_epoch;
    plan.table_row_pages[b] = n;
  }
}

}  // namespace lightspeed
