#include "plan.h"

namespace lightspeed {

Plan::Plan(const SchedulerConfig& config) {
  capacity_tokens = config.max_num_batched_tokens;
  capacity_rows = config.max_num_seqs;
  capacity_pages_per_row = config.max_pages_per_seq();
  const size_t tokens = capacity_tokens, rows_cap = capacity_rows;
  req_ids.resize(rows_cap);
  req_slots.resize(rows_cap);
  input_ids.resize(tokens);
  positions.resize(tokens);
  query_start_loc.resize(rows_cap + 1);
  seq_lens.resize(rows_cap);
  cached_lens.resize(rows_cap);
  page_table.resize(rows_cap * capacity_pages_per_row);
  slot_mapping.resize(tokens);
  logits_indices.resize(tokens);
  sample_batch_rows.resize(tokens);
  deferred_input_mask.resize(tokens);
  deferred_src_index.resize(tokens);
  // A plan copies at most every device page once per direction (retraction), plus the pages it
  // writes through (at most max_write_through_pages): these bound both lists.
  load_back.reserve(2 * static_cast<size_t>(config.num_device_pages));
  write_back.reserve(2 * (static_cast<size_t>(config.num_device_pages) + config.max_write_through_pages));
  // Disk writes are bounded by max_disk_write_pages; reads by one prompt's pages per admission
  // (more only when several requests read in one step, which may then allocate once).
  if (config.num_disk_pages > 0) {
    const size_t writes = config.max_disk_write_pages, reads = capacity_pages_per_row;
    disk_write.reserve(2 * writes);
    disk_write_keys.reserve(3 * writes);
    disk_write_tokens.reserve(writes * config.page_size);
    disk_read.reserve(2 * reads);
    disk_read_keys.reserve(reads);
    disk_read_tokens.reserve(reads * config.page_size);
  }
  appended_counts.resize(rows_cap);
  rows.resize(rows_cap);
  row_pages.resize(rows_cap);
  table_row_owner.assign(rows_cap, -1);
  table_row_epoch.assign(rows_cap, 0);
  table_row_pages.assign(rows_cap, 0);
}

void Plan::reset(int64_t step) {
  step_id = step;
  in_flight = false;
  num_rows = num_tokens = num_samples = pages_per_row = 0;
  num_prefills = num_decodes = num_decode_tokens = max_query_len = 0;
  query_start_loc[0] = 0;
  has_copies = has_disk_ops = forward_waits_for_copies = false;
  load_back.clear();
  write_back.clear();
  disk_write.clear();
  disk_write_keys.clear();
  disk_write_tokens.clear();
  disk_read.clear();
  disk_read_keys.clear();
  disk_read_tokens.clear();
}

}  // namespace lightspeed
