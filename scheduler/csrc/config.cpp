#include "config.h"

#include <stdexcept>

namespace lightspeed {

namespace {
void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("SchedulerConfig: " + message);
}
}  // namespace

void SchedulerConfig::validate() const {
  require(page_size >= 1, "page_size must be >= 1, got " + std::to_string(page_size));
  require(num_device_pages >= 2,
          "num_device_pages must be >= 2 (page 0 is padding), got " + std::to_string(num_device_pages));
  require(num_host_pages == 0 || num_host_pages >= 2,
          "num_host_pages must be 0 (no host tier) or >= 2 (page 0 is padding), got " +
              std::to_string(num_host_pages));
  require(max_write_through_pages >= 1,
          "max_write_through_pages must be >= 1, got " + std::to_string(max_write_through_pages));
  require(num_disk_pages == 0 || num_disk_pages >= 2,
          "num_disk_pages must be 0 (no disk tier) or >= 2 (slot 0 is unused), got " +
              std::to_string(num_disk_pages));
  require(num_disk_pages == 0 || num_host_pages > 0,
          "a disk tier (num_disk_pages > 0) needs a host tier (num_host_pages > 0): disk pages are read "
          "through host memory");
  require(max_disk_write_pages >= 1,
          "max_disk_write_pages must be >= 1, got " + std::to_string(max_disk_write_pages));
  require(max_num_seqs >= 1, "max_num_seqs must be >= 1, got " + std::to_string(max_num_seqs));
  require(num_spare_slots >= 0 && num_spare_slots <= max_num_seqs,
          "num_spare_slots must be in [0, max_num_seqs], got " + std::to_string(num_spare_slots));
  require(max_num_batched_tokens >= 1,
          "max_num_batched_tokens must be >= 1, got " + std::to_string(max_num_batched_tokens));
  require(chunked_prefill_size >= 1,
          "chunked_prefill_size must be >= 1, got " + std::to_string(chunked_prefill_size));
  require(max_model_len >= 1, "max_model_len must be >= 1, got " + std::to_string(max_model_len));
  require(max_num_draft_tokens >= 0 && max_num_draft_tokens <= 64,
          "max_num_draft_tokens must be in [0, 64], got " + std::to_string(max_num_draft_tokens));
  require(num_lookahead_tokens >= 0 && num_lookahead_tokens <= 64,
          "num_lookahead_tokens must be in [0, 64], got " + std::to_string(num_lookahead_tokens));
  require(policy == "decode_first" || policy == "prefill_first",
          "unknown policy '" + policy + "' (expected 'decode_first' or 'prefill_first')");
  require(eviction_policy == "queue" || eviction_policy == "lru",
          "unknown eviction_policy '" + eviction_policy + "' (expected 'queue' or 'lru')");
}

Policy SchedulerConfig::parsed_policy() const {
  return policy == "prefill_first" ? Policy::kPrefillFirst : Policy::kDecodeFirst;
}

int32_t SchedulerConfig::max_pages_per_seq() const {
  // KV is written for at most max_model_len tokens plus the draft tail of one speculative step
  // (draft slots and lookahead stop at max_model_len; the margin is kept for safety).
  return (max_model_len + max_num_draft_tokens + num_lookahead_tokens + page_size - 1) / page_size + 1;
}

}  // namespace lightspeed
