// Retraction under device-memory pressure, and the host tier of the prefix cache.
#include <gtest/gtest.h>

#include <map>

#include "test_util.h"

using namespace lightspeed;
using namespace lightspeed::testing;

namespace {

// Drives synchronous steps and checks every row continues its request's KV exactly where the
// previous row left it, across retraction and readmission.
struct Driver {
  Scheduler& s;
  std::map<int64_t, int32_t> kv_end;  // req_id -> seq_len of its latest row
  int32_t max_write_backs = 0, max_load_backs = 0;

  std::vector<FinishedRequest> run_step(int32_t token = 7) {
    Plan& plan = s.next_plan();
    max_write_backs = std::max<int32_t>(max_write_backs, plan.write_back.size() / 2);
    max_load_backs = std::max<int32_t>(max_load_backs, plan.load_back.size() / 2);
    for (int32_t b = 0; b < plan.num_rows; ++b) {
      auto it = kv_end.find(plan.req_ids[b]);
      const int32_t expected = it == kv_end.end() ? -1 : it->second;
      if (expected >= 0 && plan.cached_lens[b] != 0) EXPECT_EQ(plan.cached_lens[b], expected);
      kv_end[plan.req_ids[b]] = plan.seq_lens[b];
    }
    std::vector<int32_t> sampled(plan.num_samples, token);
    auto finished = s.advance(plan, sampled);
    s.check_invariants();
    return finished;
  }
};

SchedulerConfig tight_config(int32_t host_pages) {
  auto config = small_config(4, 9, host_pages);  // 8 usable device pages: 32 tokens
  config.enable_prefix_cache = false;
  return config;
}

}  // namespace

TEST(Retraction, VictimIsLowestPriorityThenLatestAndResumesFromHost) {
  Scheduler s(tight_config(64));
  Driver d{s};
  const int64_t a = s.submit(make_spec("a", iota_tokens(7), 3, 0));
  const int64_t b = s.submit(make_spec("b", iota_tokens(7, 100), 12, 1));
  const int64_t c = s.submit(make_spec("c", iota_tokens(7, 200), 6, 0));
  std::map<int64_t, fsm::FinishReason> finished;
  std::map<int64_t, int32_t> outputs;
  bool saw_retracting = false;
  for (int i = 0; i < 60 && finished.size() < 3; ++i) {
    for (auto& f : d.run_step()) {
      finished[f.req_id] = f.reason;
      outputs[f.req_id] = s.request_stats(f.req_id).num_output_tokens;  // readable until the next step
    }
    if (s.num_unfinished() > 0 && finished.count(c) == 0) {
      const std::string state = s.request_stats(c).state;
      saw_retracting |= state == "retracted";
      // b has the highest priority and a arrived before c: neither is ever the victim.
      if (finished.count(b) == 0) EXPECT_NE(std::string(s.request_stats(b).state), "retracted");
      if (finished.count(a) == 0) EXPECT_NE(std::string(s.request_stats(a).state), "retracted");
    }
  }
  EXPECT_TRUE(saw_retracting);
  EXPECT_GE(s.stats().num_retractions, 1);
  EXPECT_GE(d.max_write_backs, 1);  // c's KV went to host
  EXPECT_GE(d.max_load_backs, 1);   // and came back: no recompute
  ASSERT_EQ(finished.size(), 3u);
  EXPECT_EQ(outputs[c], 6);
  EXPECT_EQ(outputs[b], 12);
  EXPECT_EQ(s.stats().free_device_pages, 8);
  EXPECT_EQ(s.stats().free_host_pages, 63);
}

TEST(Retraction, WithoutHostRoomTheKvIsDroppedAndRecomputed) {
  Scheduler s(tight_config(2));  // one usable host page: c's two pages do not fit
  Driver d{s};
  s.submit(make_spec("a", iota_tokens(7), 3, 0));
  s.submit(make_spec("b", iota_tokens(7, 100), 12, 1));
  const int64_t c = s.submit(make_spec("c", iota_tokens(7, 200), 6, 0));
  int32_t finished = 0, c_outputs = 0;
  bool recomputed = false;
  for (int i = 0; i < 80 && finished < 3; ++i) {
    Plan& plan = s.next_plan();
    const int32_t row = row_of(plan, c);
    // A recompute prefill restarts from 0 and covers the prompt plus the tokens made so far.
    if (row >= 0 && plan.cached_lens[row] == 0 && plan.seq_lens[row] > 7) recomputed = true;
    EXPECT_EQ(plan.write_back.size(), 0u);
    std::vector<int32_t> sampled(plan.num_samples, 7);
    for (const auto& f : s.advance(plan, sampled)) {
      ++finished;
      if (f.req_id == c) c_outputs = s.request_stats(c).num_output_tokens;
    }
    s.check_invariants();
  }
  EXPECT_TRUE(recomputed);
  EXPECT_EQ(finished, 3);
  EXPECT_EQ(c_outputs, 6);
}

TEST(Retraction, HostPrefixHitIsLoadedBackInsteadOfRecomputed) {
  auto config = small_config(4, 12, 32);  // 11 usable device pages
  Scheduler s(config);
  const auto prompt = iota_tokens(16);
  s.submit(make_spec("a", prompt, 1));
  std::vector<FinishedRequest> finished;
  while (finished.empty()) finished = step(s);
  // The next plan writes a's cached pages through to host; acknowledge it.
  Plan& copies = s.next_plan();
  EXPECT_EQ(copies.write_back.size() / 2, 4u);
  s.advance(copies, {});
  EXPECT_EQ(s.stats().cached_host_pages, 4);
  // A different prompt needs the whole device: a's device copies are evicted, host ones stay.
  s.submit(make_spec("b", iota_tokens(40, 500), 1));
  finished.clear();
  while (finished.empty()) finished = step(s);
  EXPECT_GE(s.stats().cached_host_pages, 4);
  const int64_t c = s.submit(make_spec("c", prompt, 2));
  // c waits while b's pages are being written through, then loads its prefix from host.
  bool loaded = false;
  for (int i = 0; i < 3 && !loaded; ++i) {
    Plan& load = s.next_plan();
    loaded = std::string(s.request_stats(c).state) == "loading_prefix";
    if (loaded) {
      EXPECT_EQ(load.load_back.size() / 2, 3u);
      EXPECT_EQ(s.request_stats(c).num_cached_tokens, 12);
      EXPECT_EQ(row_of(load, c), -1);  // it computes nothing until the copy is acknowledged
    }
    std::vector<int32_t> sampled(load.num_samples, 7);
    s.advance(load, sampled);
  }
  ASSERT_TRUE(loaded);
  Plan& prefill = s.next_plan();
  const int32_t row = row_of(prefill, c);
  ASSERT_GE(row, 0);
  EXPECT_EQ(prefill.cached_lens[row], 12);
  EXPECT_EQ(prefill.seq_lens[row], 16);
  s.check_invariants();
}
