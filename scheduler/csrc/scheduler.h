// The scheduler: owns requests, KV pages and the prefix cache; builds one plan per step.
//
// Protocol: submit()/abort() at any time; next_plan() returns a plan; advance(plan, samples)
// consumes it. At most one plan may be in flight when next_plan() is called (overlap): decodes in
// the new plan then read their input token from the in-flight plan's samples, on the GPU. Plans
// must be advanced in the order they were made.
//
// Copies (write_back device->host and load_back host->device, in no fixed order between the two
// lists: they touch disjoint pages) of a plan start after every earlier plan's forward and, unless
// the plan says forward_waits_for_copies, run beside its own forward (on copy streams). The pages
// they read and write stay owned until they are acknowledged: by advance() of that plan, or with
// async_copies by copies_done(step_id), once the engine sees them land. A request waiting on copies
// (LoadingPrefix, Retracting) gets no row until then, so no forward ever reads KV that has not
// landed.
//
// Disk ops (disk_write host->disk, disk_read disk->host) of a plan run on the engine's disk workers
// and are acknowledged by disk_done(step_id), in any order with copies_done(); a plan's batch is
// complete once both have come. A disk read can fail its checks: the pages from there on are then
// recomputed, never served.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "fsm/states.h"
#include "kv/page_pool.h"
#include "plan.h"
#include "prefix/radix_cache.h"
#include "request.h"

namespace lightspeed {

// The drafter's proposals for one step, indexed by request slot (Plan.req_slots).
struct DraftInput {
  // [num_slots]: draft tokens wanted this step per slot, in [0, max_num_draft_tokens]. Empty:
  // each request's RequestSpec.num_draft_tokens. The plan may grant fewer (max_model_len, the
  // output limit); a decode row's draft count is its token count minus one.
  std::span<const int32_t> counts;
  // [num_slots, width] row-major: the draft token ids, copied into input_ids at the row's draft
  // slots. Empty: input_ids hold 0 there (a device drafter fills them).
  std::span<const int32_t> tokens;
  int32_t width = 0;
};

struct FinishedRequest {
  int64_t req_id;
  fsm::FinishReason reason;
};

struct RequestStats {
  int32_t num_prompt_tokens;
  int32_t num_cached_tokens;  // device + host + disk
  int32_t num_cached_device_tokens, num_cached_host_tokens, num_cached_disk_tokens;
  int32_t num_output_tokens;
  const char* state;
};

struct SchedulerStats {
  int32_t free_device_pages, free_host_pages, num_device_pages, num_host_pages;
  int32_t num_waiting, num_running, num_retracted, num_loading, num_writing_back, write_through_queued;
  int32_t cached_device_pages, cached_host_pages, num_in_flight_plans, num_copy_batches;
  // Cached device pages no request references: reusable at once (eviction frees them on demand),
  // so a KV usage figure counts them as free.
  int32_t unreferenced_cached_device_pages;
  int64_t prefix_hit_tokens, prefix_query_tokens, num_retractions, num_steps;
  // Disk tier (zeros without one). Hit tokens per tier sum to prefix_hit_tokens.
  int32_t free_disk_pages, num_disk_pages, cached_disk_pages, num_disk_writing, disk_write_queued;
  int64_t device_hit_tokens, host_hit_tokens, disk_hit_tokens, disk_pages_read, disk_pages_written;
  int64_t disk_read_failures, disk_write_failures;
  bool disk_writes_stopped;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerConfig config);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; returns its id. Throws std::invalid_argument on bad input (nothing changes).
  int64_t submit(const RequestSpec& spec);
  // Frees everything the request holds now; the next advance() reports it with reason "abort".
  void abort(int64_t req_id);
  // Throws std::invalid_argument when `drafts` is malformed (nothing changes then).
  Plan& next_plan(const DraftInput& drafts = {});
  // Consumes the oldest in-flight plan. `sampled` has one token per sampled position; for a
  // speculative decode row, accepted_counts[row] (1..k+1) of its k+1 samples are kept. An empty
  // accepted_counts means 1 everywhere. Returns requests that finished (valid until the next call);
  // plan.appended_counts then holds the tokens each row appended.
  const std::vector<FinishedRequest>& advance(Plan& plan, std::span<const int32_t> sampled,
                                              std::span<const int32_t> accepted_counts = {});
  // With async_copies: the copies of plan `step_id` (plan.has_copies) have landed. Any order.
  // Throws std::invalid_argument when that plan has no unacknowledged copies.
  void copies_done(int64_t step_id);
  // With async_copies: the disk ops of plan `step_id` (plan.has_disk_ops) are done. failed_writes /
  // failed_reads are rows of its disk_write / disk_read that did not happen or did not verify (a
  // record missing, torn, or not the page asked for). Throws std::invalid_argument (nothing
  // changes) when the plan has no unacknowledged disk ops or a row is out of range.
  void disk_done(int64_t step_id, std::span<const int32_t> failed_writes = {},
                 std::span<const int32_t> failed_reads = {});
  // The disk takes no more writes (full, or failing): none are planned from now on; reads go on.
  void stop_disk_writes();
  // Before the first plan: records found on disk at start-up become disk-only prefix-cache pages
  // (see RadixCache::restore_disk; oldest first). Returns accepted[i]; a rejected record's slot
  // stays free. Throws std::invalid_argument after the first plan or without a disk tier.
  std::vector<uint8_t> restore_disk_pages(std::span<const prefix::DiskRecord> records);
  // Copies in flight, or prefix pages queued for write-through (to host or disk): an idle engine
  // keeps stepping (plans with only copies) until this turns false.
  bool has_pending_copies() const {
    return !copy_batches_.empty() || write_through_size_ > 0 || disk_queue_size_ > 0;
  }

  RequestStats request_stats(int64_t req_id) const;
  std::span<const int32_t> output_token_ids(int64_t req_id) const;
  SchedulerStats stats() const;
  bool has_unfinished() const { return num_unfinished() > 0; }
  int32_t num_unfinished() const;
  const SchedulerConfig& config() const { return config_; }
  // The two plan buffers next_plan() alternates between; shared so that views of a buffer (the
  // Python bindings' numpy arrays) can keep its memory alive past the scheduler.
  const std::shared_ptr<Plan>& plan_buffer(int index) const { return plans_[index]; }

  // Recounts every page reference and list membership; throws std::logic_error on a mismatch.
  // O(pages + requests): for tests.
  void check_invariants() const;

 private:
  struct Budget {
    int32_t tokens;
    int32_t rows;
  };

  // The copies of one plan, from next_plan() until they are acknowledged. It also owns the pages
  // of requests aborted while their copy was in flight, which must not be reused before it lands.
  struct CopyBatch {
    int64_t step_id = -1;
    std::vector<int32_t> write_nodes;  // cache nodes whose host copy this plan writes through
    std::vector<int32_t> load_nodes;   // cache nodes whose device copy this plan loads
    std::vector<int32_t> disk_write_nodes;  // cache nodes this plan writes to disk (disk_write rows)
    std::vector<int32_t> disk_read_nodes;   // cache nodes this plan reads from disk (disk_read rows)
    std::vector<int32_t> disk_read_slots;   // the slot each read pins
    std::vector<int32_t> failed_writes, failed_reads;  // rows disk_done() reported failed
    std::vector<uint8_t> read_failed;       // [disk_read rows], filled when the batch completes
    std::vector<int64_t> waiters;      // requests in ReadingDisk / LoadingPrefix / Retracting on these
    std::vector<kv::PageList> held;    // pages of requests aborted mid-copy
    bool awaiting_copies = false;      // copies_done() still to come
    bool awaiting_disk = false;        // disk_done() still to come
    bool empty() const {
      return write_nodes.empty() && load_nodes.empty() && waiters.empty() && disk_write_nodes.empty() &&
             disk_read_nodes.empty();
    }
  };

  struct WriteThroughEntry {
    int32_t node;
    uint64_t key;  // the node's key when queued: a recycled node id does not match it
  };

  // --- scheduler.cpp: request table
  Request& lookup(int64_t req_id, const char* caller);
  const Request& lookup(int64_t req_id, const char* caller) const;
  bool before(int32_t a, int32_t b) const;  // scheduling order: priority desc, then arrival
  void insert_sorted(std::vector<int32_t>& list, int32_t record);
  static void erase_from(std::vector<int32_t>& list, int32_t record);
  void release_slot(Request& r);
  void recycle(int32_t record);

  // --- scheduler_plan.cpp: building a plan
  void validate_drafts(const DraftInput& drafts) const;
  void schedule_decodes(Plan& plan, Budget& budget, const DraftInput& drafts);
  void schedule_prefills(Plan& plan, Budget& budget);
  bool schedule_chunk(Plan& plan, Budget& budget, int32_t record);
  void readmit_retracted(Plan& plan);
  void admit_waiting(Plan& plan, Budget& budget);
  bool hits_limit_with_next_token(const Request& r) const;
  int32_t count_finishing(int64_t in_flight_step) const;
  bool slot_for_new_request() const;
  void start(Plan& plan, Budget& budget, int32_t record, prefix::MatchResult match, kv::PageList device_pages,
             kv::PageList host_pins);
  int32_t reserve_disk_reads(int32_t num_disk, kv::PageList& host_pins);
  void read_from_disk(Plan& plan, int32_t record, prefix::MatchResult match, kv::PageList device_pages,
                      kv::PageList host_pins, int32_t cached_tokens);
  void load_landed(Plan& plan);
  bool grow_pages(Plan& plan, int32_t record, kv::PageList& pages, int32_t num_tokens, bool may_retract_decodes);
  bool retract_victim(Plan& plan, int32_t record, bool decodes_too);
  void retract(Plan& plan, int32_t record);
  bool ensure_device_free(int32_t pages, bool for_copy);
  void emit_row(Plan& plan, Request& r, const kv::PageList& pages, int32_t kv_start, int32_t num_tokens,
                int32_t num_samples, const int32_t* draft_tokens = nullptr, int32_t lookahead = 0,
                bool provisional = false);
  void finalize(Plan& plan);
  void queue_write_through(int32_t node);
  void emit_write_through(Plan& plan);
  void queue_disk_write(int32_t node);
  void emit_disk_writes(Plan& plan);
  void seal_copies(Plan& plan);
  void settle_disk_ops(CopyBatch& batch);
  void land_disk_reads(Request& r, const CopyBatch& batch);
  CopyBatch* find_batch(int64_t step_id);
  void maybe_complete(CopyBatch& batch);
  void hold_for_copy(Request& r);

  // --- scheduler_eviction.cpp: eviction order
  void protect_waiting_prefixes();

  // --- scheduler_advance.cpp: consuming a plan
  void validate_advance(const Plan& plan, std::span<const int32_t> sampled,
                        std::span<const int32_t> accepted_counts) const;
  void complete_batch(size_t index);
  void apply_row(Plan& plan, int32_t row, std::span<const int32_t> sampled, int32_t accepted);
  void settle_kv(const Plan& plan, const PlanRow& info, Request& r, int32_t accepted);
  bool append_token(Request& r, int32_t token, fsm::FinishReason* reason) const;
  void finish(int32_t record, fsm::FinishReason reason);
  void insert_into_cache(Request& r, kv::PageList& pages, int32_t num_valid_tokens);

  SchedulerConfig config_;
  Policy policy_;
  int32_t page_size_;
  int32_t max_pages_per_seq_;
  kv::PagePool device_;
  kv::PagePool host_;
  kv::PagePool disk_;  // disk slots: the engine's disk tier stores page p at slot p
  prefix::RadixCache cache_;

  std::vector<Request> records_;           // grows only at submit; records are recycled
  std::vector<int32_t> free_records_;
  std::unordered_map<int64_t, int32_t> record_of_;  // req_id -> record; off the per-step path
  std::unordered_map<std::string, int64_t> live_rids_;
  std::vector<int32_t> slot_record_;       // slot -> record, or -1
  std::vector<int32_t> free_slots_;

  // Lists of records, each in scheduling order.
  std::vector<int32_t> waiting_;    // Waiting
  std::vector<int32_t> running_;    // Prefilling, Decoding
  std::vector<int32_t> retracted_;  // Retracting, Retracted
  std::vector<int32_t> loading_;    // ReadingDisk, DiskLanded, LoadingPrefix

  std::array<std::shared_ptr<Plan>, 2> plans_;  // double buffer: plan N stays valid while N+1 exists
  int64_t next_step_ = 0;
  int32_t num_in_flight_ = 0;
  int32_t num_finishing_ = 0;  // of the plan being built: requests the plan in flight finishes
  int64_t next_req_id_ = 0;
  uint64_t next_arrival_ = 0;

  // Copies: the batch the plan being built fills, those in flight (in step order), and spares
  // whose vectors keep their capacity, so steady-state steps do not allocate.
  CopyBatch building_;
  std::vector<CopyBatch> copy_batches_;
  std::vector<CopyBatch> spare_batches_;
  // Write-through: cache nodes whose pages should reach host, oldest first (a ring buffer of
  // fixed capacity; when full, new nodes are not queued) and how many copies are in flight.
  std::vector<WriteThroughEntry> write_through_;
  size_t write_through_head_ = 0;
  size_t write_through_size_ = 0;
  int32_t write_through_in_flight_ = 0;
  // Disk writes: nodes whose landed host copy should reach disk, in the order their host copies
  // landed (parents first), as the write-through ring; and how many writes are in flight.
  std::vector<WriteThroughEntry> disk_queue_;
  size_t disk_queue_head_ = 0;
  size_t disk_queue_size_ = 0;
  int32_t disk_write_in_flight_ = 0;
  bool disk_writes_stopped_ = false;

  std::vector<FinishedRequest> finished_;      // advance()'s result
  std::vector<int64_t> pending_abort_reports_; // aborted, reported by the next advance()
  std::vector<int32_t> reclaim_;               // records to recycle at the next advance()
  std::vector<int32_t> match_path_;            // scratch for prefix matching
  // Queue-aware eviction: the cache's eviction count when waiting prefixes were last protected, and
  // scratch for the records protected (admission order) and their matches.
  static constexpr size_t kMaxProtected = 64;
  bool queue_eviction_ = false;  // config_.eviction_policy == "queue" (and a prefix cache)
  int64_t evictions_at_protect_ = 0;
  uint32_t protect_epoch_ = 0;  // of the latest protection
  uint32_t spare_epoch_ = 0;    // what the write-through's host eviction spares: this plan's protection, or 0
  std::vector<int32_t> protect_order_;
  std::vector<int32_t> protect_path_;
  std::vector<int32_t> order_;                 // scratch: running_ snapshot while scheduling

  // The waiting request that last failed admission and the device capacity it saw: it is not
  // matched (hashed) again until capacity grows, so a blocked long prompt costs nothing per step.
  int64_t blocked_req_id_ = -1;
  int32_t blocked_capacity_ = 0;

  int64_t prefix_hit_tokens_ = 0;
  int64_t prefix_query_tokens_ = 0;
  int64_t num_retractions_ = 0;
  int64_t hit_tokens_by_tier_[3] = {0, 0, 0};  // device, host, disk
  int64_t disk_pages_read_ = 0, disk_pages_written_ = 0, disk_read_failures_ = 0, disk_write_failures_ = 0;
};

}  // namespace lightspeed
