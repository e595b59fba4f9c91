// One step's plan: flat arrays the engine turns into tensors without a per-request loop.
// Buffers are sized once from the config; building a plan never allocates.
#pragma once

#include <cstdint>
#include <vector>

#include "config.h"
#include "kv/page_pool.h"

namespace lightspeed {

// Per-row facts advance() needs back.
struct PlanRow {
  int32_t kv_start = 0;      // KV tokens before this step (cached_lens)
  int32_t num_tokens = 0;    // query tokens this step
  int32_t sample_begin = 0;  // first index into the sampled-token array
  int32_t num_samples = 0;   // 0 (prefill chunk mid-prompt), 1, or 1 + draft tokens
  uint32_t page_epoch = 0;   // the request's page_epoch when the row was built
  int32_t lookahead = 0;     // KV tokens reserved past the row (page-table entries included)
  // The row follows a speculative row still in flight: kv_start (and so positions, slots and
  // seq_len) assume that row accepts all its drafts; the true start is lower by what it rejects.
  bool provisional = false;
};

struct Plan {
  explicit Plan(const SchedulerConfig& config);
  void reset(int64_t step);

  int64_t step_id = -1;
  bool in_flight = false;  // handed out by next_plan() and not yet advanced
  int32_t num_rows = 0;          // B
  int32_t num_tokens = 0;        // T
  int32_t num_samples = 0;       // S
  int32_t pages_per_row = 0;     // P: widest row's page count
  int32_t num_prefills = 0;
  int32_t num_decodes = 0;       // rows [0, num_decodes) are decodes
  int32_t num_decode_tokens = 0; // tokens [0, num_decode_tokens) belong to decodes
  int32_t max_query_len = 0;
  bool has_copies = false;                // device<->host copies to acknowledge (copies_done)
  bool has_disk_ops = false;              // disk reads / writes to acknowledge (disk_done)
  bool forward_waits_for_copies = false;  // the forward may overwrite pages the copies read

  // [capacity] buffers; the first B / T / S / ... entries are the plan.
  std::vector<int64_t> req_ids;            // [B]
  std::vector<int32_t> req_slots;          // [B]
  std::vector<int32_t> input_ids;          // [T]; 0 where deferred or a draft slot
  std::vector<int64_t> positions;          // [T]
  std::vector<int32_t> query_start_loc;    // [B + 1]
  std::vector<int32_t> seq_lens;           // [B] KV tokens after this step
  std::vector<int32_t> cached_lens;        // [B] KV tokens before this step
  std::vector<int32_t> page_table;         // [B, P] row-major, padded with page 0
  std::vector<int64_t> slot_mapping;       // [T] page * page_size + offset
  std::vector<int32_t> logits_indices;     // [S] flat token index of each sampled position
  std::vector<int32_t> sample_batch_rows;  // [S] batch row of each sampled position
  std::vector<uint8_t> deferred_input_mask;  // [T] input is the previous plan's sample
  std::vector<int32_t> deferred_src_index;   // [T] index into that plan's samples, or -1
  std::vector<int32_t> load_back;   // [N, 2] (host page, device page); capacity-reserved
  std::vector<int32_t> write_back;  // [M, 2] (device page, host page); capacity-reserved
  // Disk I/O, acknowledged by disk_done(). A record holds its node's key, parent key, depth and
  // tokens besides the page, so that it can be verified when read and the tree rebuilt at start-up.
  std::vector<int32_t> disk_write;         // [K, 2] (host page, disk slot)
  std::vector<uint64_t> disk_write_keys;   // [K, 3] (key, parent key, depth)
  std::vector<int32_t> disk_write_tokens;  // [K, page_size]
  std::vector<int32_t> disk_read;          // [R, 2] (disk slot, host page)
  std::vector<uint64_t> disk_read_keys;    // [R] the key the record must carry
  std::vector<int32_t> disk_read_tokens;   // [R, page_size] the tokens the record must carry
  std::vector<int32_t> appended_counts;    // [B] tokens advance() appended per row (0: void row)

  // Scheduler-side bookkeeping, not exported.
  std::vector<PlanRow> rows;                       // [B]
  std::vector<const kv::PageList*> row_pages;      // [B] pages backing each row at build time
  // Page-table rows persist across the plans built into this buffer; a row is rewritten only from
  // the first page that differs from what it held (decode rows rarely change between steps).
  std::vector<int64_t> table_row_owner;            // [B cap] req_id whose pages row b holds
  std::vector<uint32_t> table_row_epoch;           // [B cap] that request's page_epoch then
  std::vector<int32_t> table_row_pages;            // [B cap] pages written in row b
  int32_t table_width = 0;                         // P of the table as last written
  int32_t capacity_tokens = 0;
  int32_t capacity_rows = 0;
  int32_t capacity_pages_per_row = 0;
};

}  // namespace lightspeed
