// Helpers shared by the scheduler's gtests.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "scheduler.h"

namespace lightspeed::testing {

inline SchedulerConfig small_config(int32_t page_size = 4, int32_t device_pages = 64, int32_t host_pages = 64) {
  SchedulerConfig config;
  config.page_size = page_size;
  config.num_device_pages = device_pages;
  config.num_host_pages = host_pages;
  config.max_num_seqs = 8;
  config.max_num_batched_tokens = 64;
  config.chunked_prefill_size = 16;
  config.max_model_len = 256;
  return config;
}

inline std::vector<int32_t> iota_tokens(int32_t count, int32_t first = 10) {
  std::vector<int32_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

inline RequestSpec make_spec(const std::string& rid, std::vector<int32_t> tokens, int32_t max_new_tokens = 8,
                             int32_t priority = 0) {
  RequestSpec spec;
  spec.rid = rid;
  spec.token_ids = std::move(tokens);
  spec.max_new_tokens = max_new_tokens;
  spec.eos_token_ids = {2};
  spec.priority = priority;
  return spec;
}

// One synchronous step, every sample set to `token`.
inline std::vector<FinishedRequest> step(Scheduler& s, int32_t token = 7) {
  Plan& plan = s.next_plan();
  std::vector<int32_t> sampled(plan.num_samples, token);
  return s.advance(plan, sampled);
}

inline int32_t row_of(const Plan& plan, int64_t req_id) {
  for (int32_t b = 0; b < plan.num_rows; ++b)
    if (plan.req_ids[b] == req_id) return b;
  return -1;
}

}  // namespace lightspeed::testing
