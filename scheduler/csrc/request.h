// A request's record: what it asked for, what it produced, and its lifecycle state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsm/states.h"

namespace lightspeed {

struct Request {
  int64_t req_id = -1;  // unique for the scheduler's lifetime, never reused
  std::string rid;
  std::vector<int32_t> tokens;  // prompt, then accepted output tokens; capacity reserved at submit
  int32_t num_prompt_tokens = 0;
  int32_t max_new_tokens = 0;
  std::vector<int32_t> eos_token_ids;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t priority = 0;
  int32_t num_draft_tokens = 0;  // drafts per decode step when next_plan() is given no per-step counts
  int32_t retention = 0;  // RequestSpec::retention, applied to the cache nodes it touches
  uint64_t arrival = 0;  // submit order; ties in priority go to the earlier arrival

  int32_t slot = -1;               // row for per-request GPU state, held from admission to finish
  bool admitted_once = false;
  int32_t num_cached_tokens = 0;   // prefix-cache hit at first admission
  int32_t cached_pages_by_tier[3] = {0, 0, 0};  // of that hit: pages from device, host, disk
  bool disk_hit_counted = false;   // that hit's disk pages are counted but their reads not yet checked
  std::vector<int32_t> cache_path; // prefix-cache nodes backing this request's leading device pages
  // While waiting: the deepest node of its cached prefix when last protected from eviction (and
  // that node's key, since node ids are recycled), so the next protection touches it without a match.
  int32_t protected_leaf = -1;
  uint64_t protected_key = 0;

  // Overlap bookkeeping: samples not yet returned by advance(), and where the latest one lands in
  // its plan's sampled-token array (a decode in the next plan reads its input from there).
  int32_t pending_samples = 0;
  int64_t last_sample_step = -1;
  int32_t last_sample_index = -1;
  int64_t scheduled_step = -1;  // latest plan with a row for this request
  // Speculative rows under overlap. The latest row's draft count: while that row is in flight the
  // KV end (kv_len) counts every draft as accepted, and a row planned behind it starts there
  // (provisionally; the engine shifts it on the device by the drafts the in-flight row rejects).
  int32_t last_row_drafts = 0;
  // Drafts the previous row rejected, set by its advance() while a later row is in flight: that
  // row's true kv_start is its planned one minus this (consumed by its advance()).
  int32_t pending_shift = 0;
  // Bumped whenever the device page list changes other than by appending (dedup swap, truncation,
  // retraction, readmission): plan page-table rows are reused only while it is unchanged.
  uint32_t page_epoch = 0;
  int64_t copy_step = -1;  // step of the copy batch this request waits on (LoadingPrefix, Retracting)

  fsm::RequestState state;

  int32_t num_output_tokens() const { return static_cast<int32_t>(tokens.size()) - num_prompt_tokens; }
};

}  // namespace lightspeed
