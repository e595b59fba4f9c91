// Request table: submit, abort, lookups, statistics and the invariant check.
#include "scheduler.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "fsm/transitions.h"

namespace lightspeed {

namespace {
[[noreturn]] void bad_input(const std::string& message) { throw std::invalid_argument(message); }
}  // namespace

Scheduler::Scheduler(SchedulerConfig config)
    : config_((config.validate(), std::move(config))),
      policy_(config_.parsed_policy()),
      page_size_(config_.page_size),
      max_pages_per_seq_(config_.max_pages_per_seq()),
      device_(config_.num_device_pages),
      host_(std::max(config_.num_host_pages, 1)),  // 0: a tier of only the padding page
      disk_(std::max(config_.num_disk_pages, 1)),
      cache_(device_, host_, disk_, config_.page_size) {
  slot_record_.assign(config_.num_slots(), -1);
  for (int32_t slot = config_.num_slots() - 1; slot >= 0; --slot) free_slots_.push_back(slot);
  plans_[0] = std::make_shared<Plan>(config_);
  plans_[1] = std::make_shared<Plan>(config_);
  running_.reserve(config_.num_slots());
  retracted_.reserve(config_.num_slots());
  loading_.reserve(config_.num_slots());
  // Each node is queued at most once at a time; nodes are bounded by the pages of both tiers.
  write_through_.resize(1 + static_cast<size_t>(device_.num_usable()) + host_.num_usable() + disk_.num_usable());
  if (disk_.num_usable() > 0) disk_queue_.resize(write_through_.size());
  copy_batches_.reserve(8);
  spare_batches_.reserve(8);
  finished_.reserve(config_.num_slots() + 64);
  reclaim_.reserve(config_.num_slots() + 64);
  match_path_.reserve(max_pages_per_seq_);
  queue_eviction_ = config_.eviction_policy == "queue" && config_.enable_prefix_cache;
  protect_order_.reserve(kMaxProtected);
  protect_path_.reserve(max_pages_per_seq_);
  order_.reserve(config_.num_slots());
}

int64_t Scheduler::submit(const RequestSpec& spec) {
  const auto prompt_len = static_cast<int64_t>(spec.token_ids.size());
  if (prompt_len == 0) bad_input("submit(): request '" + spec.rid + "' has an empty prompt");
  if (prompt_len > config_.max_model_len)
    bad_input("submit(): request '" + spec.rid + "' has a prompt of " + std::to_string(prompt_len) +
              " tokens, longer than max_model_len=" + std::to_string(config_.max_model_len));
  if (spec.max_new_tokens < 1)
    bad_input("submit(): max_new_tokens must be >= 1, got " + std::to_string(spec.max_new_tokens));
  if (spec.num_draft_tokens < 0 || spec.num_draft_tokens > config_.max_num_draft_tokens)
    bad_input("submit(): num_draft_tokens must be in [0, " + std::to_string(config_.max_num_draft_tokens) +
              "], got " + std::to_string(spec.num_draft_tokens));
  if (spec.retention < 0 || spec.retention > kMaxRetention)
    bad_input("submit(): retention must be in [0, " + std::to_string(kMaxRetention) + "], got " +
              std::to_string(spec.retention));
  if (std::any_of(spec.token_ids.begin(), spec.token_ids.end(), [](int32_t t) { return t < 0; }))
    bad_input("submit(): request '" + spec.rid + "' has a negative token id");
  const int64_t pages_needed = (prompt_len + 1 + page_size_ - 1) / page_size_;
  if (pages_needed > device_.num_usable())
    bad_input("submit(): request '" + spec.rid + "' needs " + std::to_string(pages_needed) +
              " KV pages, more than the device pool's " + std::to_string(device_.num_usable()));
  if (live_rids_.count(spec.rid) != 0) bad_input("submit(): duplicate live rid '" + spec.rid + "'");

  int32_t record;
  if (!free_records_.empty()) {
    record = free_records_.back();
    free_records_.pop_back();
  } else {
    record = static_cast<int32_t>(records_.size());
    records_.emplace_back();
  }
  Request& r = records_[record];
  r.req_id = next_req_id_++;
  r.rid = spec.rid;
  // Reserved up front so that appending outputs never reallocates on the step path.
  r.tokens.reserve(std::min<int64_t>(prompt_len + spec.max_new_tokens, config_.max_model_len) + 1);
  r.tokens.assign(spec.token_ids.begin(), spec.token_ids.end());
  r.num_prompt_tokens = static_cast<int32_t>(prompt_len);
  r.max_new_tokens = spec.max_new_tokens;
  r.eos_token_ids = spec.eos_token_ids;
  r.stop_token_ids = spec.stop_token_ids;
  r.ignore_eos = spec.ignore_eos;
  r.priority = spec.priority;
  r.num_draft_tokens = spec.num_draft_tokens;
  r.retention = spec.retention;
  r.arrival = next_arrival_++;
  r.slot = -1;
  r.admitted_once = false;
  r.num_cached_tokens = 0;
  std::fill(std::begin(r.cached_pages_by_tier), std::end(r.cached_pages_by_tier), 0);
  r.cache_path.clear();
  r.cache_path.reserve(max_pages_per_seq_);
  r.protected_leaf = -1;
  r.pending_samples = 0;
  r.last_sample_step = r.scheduled_step = -1;
  r.last_sample_index = -1;
  r.last_row_drafts = r.pending_shift = 0;
  r.page_epoch = 0;
  r.copy_step = -1;
  r.state = fsm::Waiting{};
  record_of_[r.req_id] = record;
  live_rids_[r.rid] = r.req_id;
  insert_sorted(waiting_, record);
  return r.req_id;
}

void Scheduler::abort(int64_t req_id) {
  Request& r = lookup(req_id, "abort");
  const int32_t record = record_of_.at(req_id);
  if (std::holds_alternative<fsm::Finished>(r.state) || std::holds_alternative<fsm::Aborted>(r.state))
    bad_input("abort(): request " + std::to_string(req_id) + " has already finished");
  erase_from(waiting_, record);
  erase_from(running_, record);
  erase_from(retracted_, record);
  erase_from(loading_, record);
  hold_for_copy(r);
  std::visit(
      [&](auto&& state) {
        using S = std::decay_t<decltype(state)>;
        if constexpr (!std::is_same_v<S, fsm::Finished> && !std::is_same_v<S, fsm::Aborted>)
          r.state = fsm::abort(std::move(state));
      },
      std::move(r.state));
  release_slot(r);
  live_rids_.erase(r.rid);
  pending_abort_reports_.push_back(req_id);
}

Request& Scheduler::lookup(int64_t req_id, const char* caller) {
  auto it = record_of_.find(req_id);
  if (it == record_of_.end())
    bad_input(std::string(caller) + "(): unknown request id " + std::to_string(req_id));
  return records_[it->second];
}

const Request& Scheduler::lookup(int64_t req_id, const char* caller) const {
  return const_cast<Scheduler*>(this)->lookup(req_id, caller);
}

bool Scheduler::before(int32_t a, int32_t b) const {
  const Request& x = records_[a];
  const Request& y = records_[b];
  return x.priority != y.priority ? x.priority > y.priority : x.arrival < y.arrival;
}

void Scheduler::insert_sorted(std::vector<int32_t>& list, int32_t record) {
  auto at = std::upper_bound(list.begin(), list.end(), record,
                             [this](int32_t a, int32_t b) { return before(a, b); });
  list.insert(at, record);
}

void Scheduler::erase_from(std::vector<int32_t>& list, int32_t record) {
  auto it = std::find(list.begin(), list.end(), record);
  if (it != list.end()) list.erase(it);
}

void Scheduler::release_slot(Request& r) {
  if (r.slot < 0) return;
  slot_record_[r.slot] = -1;
  free_slots_.push_back(r.slot);
  r.slot = -1;
}

void Scheduler::recycle(int32_t record) {
  Request& r = records_[record];
  record_of_.erase(r.req_id);
  r.req_id = -1;
  r.state = fsm::Waiting{};
  free_records_.push_back(record);
}

RequestStats Scheduler::request_stats(int64_t req_id) const {
  const Request& r = lookup(req_id, "request_stats");
  return RequestStats{r.num_prompt_tokens,
                      r.num_cached_tokens,
                      r.cached_pages_by_tier[0] * page_size_,
                      r.cached_pages_by_tier[1] * page_size_,
                      r.cached_pages_by_tier[2] * page_size_,
                      r.num_output_tokens(),
                      fsm::state_name(r.state)};
}

std::span<const int32_t> Scheduler::output_token_ids(int64_t req_id) const {
  const Request& r = lookup(req_id, "output_token_ids");
  return std::span<const int32_t>(r.tokens).subspan(r.num_prompt_tokens);
}

int32_t Scheduler::num_unfinished() const {
  return static_cast<int32_t>(waiting_.size() + running_.size() + retracted_.size() + loading_.size() +
                              pending_abort_reports_.size());
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s{};
  s.free_device_pages = device_.num_free();
  s.free_host_pages = host_.num_free();
  s.num_device_pages = device_.num_pages();
  s.num_host_pages = config_.num_host_pages;
  s.num_waiting = static_cast<int32_t>(waiting_.size());
  s.num_running = static_cast<int32_t>(running_.size());
  s.num_retracted = static_cast<int32_t>(retracted_.size());
  s.num_loading = static_cast<int32_t>(loading_.size());
  s.num_writing_back = write_through_in_flight_;
  s.write_through_queued = static_cast<int32_t>(write_through_size_);
  s.num_copy_batches = static_cast<int32_t>(copy_batches_.size());
  s.cached_device_pages = cache_.num_device_resident();
  s.cached_host_pages = cache_.num_host_resident();
  s.unreferenced_cached_device_pages = cache_.num_unreferenced_device();
  s.num_in_flight_plans = num_in_flight_;
  s.prefix_hit_tokens = prefix_hit_tokens_;
  s.prefix_query_tokens = prefix_query_tokens_;
  s.num_retractions = num_retractions_;
  s.num_steps = next_step_;
  s.free_disk_pages = disk_.num_free();
  s.num_disk_pages = config_.num_disk_pages;
  s.cached_disk_pages = cache_.num_disk_resident();
  s.num_disk_writing = disk_write_in_flight_;
  s.disk_write_queued = static_cast<int32_t>(disk_queue_size_);
  s.device_hit_tokens = hit_tokens_by_tier_[0];
  s.host_hit_tokens = hit_tokens_by_tier_[1];
  s.disk_hit_tokens = hit_tokens_by_tier_[2];
  s.disk_pages_read = disk_pages_read_;
  s.disk_pages_written = disk_pages_written_;
  s.disk_read_failures = disk_read_failures_;
  s.disk_write_failures = disk_write_failures_;
  s.disk_writes_stopped = disk_writes_stopped_;
  return s;
}

void Scheduler::check_invariants() const {
  auto fail = [](const std::string& what) { throw std::logic_error("scheduler invariant: " + what); };
  cache_.check_invariants();
  std::vector<int32_t> device_refs(device_.num_pages(), 0), host_refs(host_.num_pages(), 0),
      disk_refs(disk_.num_pages(), 0), disk_by_requests(disk_.num_pages(), 0);
  std::vector<int32_t> device_cached(device_.num_pages(), 0), host_cached(host_.num_pages(), 0);
  std::vector<int32_t> device_by_requests(device_.num_pages(), 0), host_by_requests(host_.num_pages(), 0);
  device_refs[0] = host_refs[0] = disk_refs[0] = 1;  // the padding pages
  cache_.for_each_disk_ref([&](int32_t p) { ++disk_refs[p]; });
  cache_.for_each_device_ref([&](int32_t p) { ++device_refs[p], ++device_cached[p]; });
  cache_.for_each_host_ref([&](int32_t p) { ++host_refs[p], ++host_cached[p]; });
  std::vector<int32_t> seen;
  auto count = [&](std::vector<int32_t>& refs, std::vector<int32_t>& by_requests, const kv::PageList& list) {
    seen.assign(list.pages().begin(), list.pages().end());
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end()) fail("a page list holds a page twice");
    if (!seen.empty() && seen.front() <= 0) fail("a request owns the padding page");
    for (int32_t p : list.pages()) ++refs[p], ++by_requests[p];
  };
  size_t live = 0;
  for (size_t i = 0; i < records_.size(); ++i) {
    const Request& r = records_[i];
    if (r.req_id < 0) continue;
    std::visit(
        [&](const auto& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<S, fsm::ReadingDisk>) {
            count(disk_refs, disk_by_requests, s.disk_slots);
          }
          if constexpr (std::is_same_v<S, fsm::LoadingPrefix> || std::is_same_v<S, fsm::ReadingDisk> ||
                        std::is_same_v<S, fsm::DiskLanded>) {
            count(device_refs, device_by_requests, s.device_pages);
            count(host_refs, host_by_requests, s.host_pages);
          } else if constexpr (std::is_same_v<S, fsm::Prefilling> || std::is_same_v<S, fsm::Decoding>) {
            count(device_refs, device_by_requests, s.device_pages);
          } else if constexpr (std::is_same_v<S, fsm::Retracting> || std::is_same_v<S, fsm::Retracted>) {
            count(host_refs, host_by_requests, s.host_pages);
          }
        },
        r.state);
    const bool in_waiting = std::count(waiting_.begin(), waiting_.end(), int32_t(i)) == 1;
    const bool in_running = std::count(running_.begin(), running_.end(), int32_t(i)) == 1;
    const bool in_retracted = std::count(retracted_.begin(), retracted_.end(), int32_t(i)) == 1;
    const bool in_loading = std::count(loading_.begin(), loading_.end(), int32_t(i)) == 1;
    const auto& st = r.state;
    const bool waiting = std::holds_alternative<fsm::Waiting>(st);
    const bool loading = std::holds_alternative<fsm::ReadingDisk>(st) || std::holds_alternative<fsm::DiskLanded>(st) ||
                         std::holds_alternative<fsm::LoadingPrefix>(st);
    const bool running = std::holds_alternative<fsm::Prefilling>(st) || std::holds_alternative<fsm::Decoding>(st);
    const bool retracted = std::holds_alternative<fsm::Retracting>(st) || std::holds_alternative<fsm::Retracted>(st);
    if (in_waiting != waiting || in_loading != loading || in_running != running || in_retracted != retracted)
      fail("request " + std::to_string(r.req_id) + " is in the wrong list for state " + fsm::state_name(r.state));
    const bool done = std::holds_alternative<fsm::Finished>(st) || std::holds_alternative<fsm::Aborted>(st);
    if (!done) ++live;
    if (r.slot >= 0 && slot_record_[r.slot] != int32_t(i)) fail("slot table disagrees with a request");
    if (done && r.slot >= 0) fail("a finished request holds a slot");
  }
  if (live != waiting_.size() + running_.size() + retracted_.size() + loading_.size())
    fail("request lists hold unknown records");
  // Pages held for copies in flight on behalf of aborted requests.
  for (const CopyBatch& batch : copy_batches_)
    for (const kv::PageList& list : batch.held) {
      if (list.pool() == &disk_) count(disk_refs, disk_by_requests, list);
      else if (list.pool() == &device_) count(device_refs, device_by_requests, list);
      else count(host_refs, host_by_requests, list);
    }
  int32_t writing = 0, disk_writing = 0;
  for (const CopyBatch& batch : copy_batches_) {
    writing += static_cast<int32_t>(batch.write_nodes.size());
    disk_writing += static_cast<int32_t>(batch.disk_write_nodes.size());
    if (!batch.awaiting_copies && !batch.awaiting_disk) fail("a copy batch acknowledged in full is still held");
  }
  if (writing != write_through_in_flight_) fail("write-through pages in flight miscounted");
  if (disk_writing != disk_write_in_flight_) fail("disk writes in flight miscounted");
  auto compare = [&](const kv::PagePool& pool, const std::vector<int32_t>& refs, const char* tier) {
    int32_t free_pages = 0;
    for (int32_t p = 0; p < pool.num_pages(); ++p) {
      if (pool.refcount(p) != refs[p])
        fail(std::string(tier) + " page " + std::to_string(p) + " has refcount " +
             std::to_string(pool.refcount(p)) + " but " + std::to_string(refs[p]) + " owners");
      free_pages += refs[p] == 0;
    }
    if (free_pages != pool.num_free()) fail(std::string(tier) + " free list size != unowned pages");
  };
  compare(device_, device_refs, "device");
  compare(host_, host_refs, "host");
  compare(disk_, disk_refs, "disk");
  // Sharing between requests happens only through the prefix cache.
  for (int32_t p = 1; p < device_.num_pages(); ++p)
    if (device_by_requests[p] > 1 && device_cached[p] == 0) fail("device page shared outside the prefix cache");
  for (int32_t p = 1; p < host_.num_pages(); ++p)
    if (host_by_requests[p] > 1 && host_cached[p] == 0) fail("host page shared outside the prefix cache");
}

}  // namespace lightspeed
