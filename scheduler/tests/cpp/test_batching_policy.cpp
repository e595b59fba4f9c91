// Batching policy and admission: budgets, row order, priorities, prefix sharing, bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>

#include "test_util.h"

using namespace lightspeed;
using namespace lightspeed::testing;

TEST(Batching, DecodeFirstStreamsALongPrefillBesideRunningDecodes) {
  Scheduler s(small_config());
  const int64_t a = s.submit(make_spec("a", iota_tokens(8), 40));
  step(s);
  const int64_t b = s.submit(make_spec("b", iota_tokens(100, 200), 4));
  int32_t prefill_steps = 0;
  while (s.request_stats(b).num_output_tokens == 0) {
    Plan& plan = s.next_plan();
    ASSERT_EQ(plan.num_decodes, 1);
    EXPECT_EQ(plan.req_ids[0], a);  // decode rows come first, every step
    EXPECT_EQ(plan.query_start_loc[1], 1);
    if (plan.num_prefills == 1) {
      EXPECT_EQ(plan.req_ids[1], b);
      EXPECT_LE(plan.seq_lens[1] - plan.cached_lens[1], 16);  // chunked_prefill_size
      ++prefill_steps;
    }
    std::vector<int32_t> sampled(plan.num_samples, 7);
    s.advance(plan, sampled);
  }
  EXPECT_EQ(prefill_steps, 7);  // ceil(100 / 16)
  s.check_invariants();
}

TEST(Batching, SeveralPrefillChunksShareAStep) {
  Scheduler s(small_config());
  for (int i = 0; i < 3; ++i) s.submit(make_spec("r" + std::to_string(i), iota_tokens(40, 100 * i + 10)));
  Plan& plan = s.next_plan();
  EXPECT_EQ(plan.num_prefills, 3);
  EXPECT_EQ(plan.num_tokens, 48);
  EXPECT_EQ(plan.num_samples, 0);  // no prompt completes in the first chunk
}

TEST(Batching, TokenAndSequenceBudgetsHold) {
  auto config = small_config();
  config.max_num_seqs = 3;
  config.max_num_batched_tokens = 20;
  Scheduler s(config);
  for (int i = 0; i < 6; ++i) s.submit(make_spec("r" + std::to_string(i), iota_tokens(12, 50 * i + 10), 30));
  for (int i = 0; i < 40; ++i) {
    Plan& plan = s.next_plan();
    EXPECT_LE(plan.num_rows, 3);
    EXPECT_LE(plan.num_tokens, 20);
    std::vector<int32_t> sampled(plan.num_samples, 7);
    s.advance(plan, sampled);
    s.check_invariants();
  }
}

TEST(Batching, PrefillFirstRunsPrefillStepsWithoutDecodes) {
  auto config = small_config();
  config.policy = "prefill_first";
  Scheduler s(config);
  s.submit(make_spec("a", iota_tokens(8), 40));
  step(s);
  s.submit(make_spec("b", iota_tokens(40, 200), 4));
  for (int i = 0; i < 3; ++i) {
    Plan& plan = s.next_plan();
    EXPECT_EQ(plan.num_decodes, 0);
    EXPECT_EQ(plan.num_prefills, 1);
    std::vector<int32_t> sampled(plan.num_samples, 7);
    s.advance(plan, sampled);
  }
  Plan& plan = s.next_plan();  // b's prompt is done: both decode
  EXPECT_EQ(plan.num_decodes, 2);
  EXPECT_EQ(plan.num_prefills, 0);
}

TEST(Batching, HigherPriorityIsAdmittedFirst) {
  auto config = small_config();
  config.max_num_seqs = 1;
  Scheduler s(config);
  const int64_t low = s.submit(make_spec("low", iota_tokens(8), 2, 0));
  const int64_t high = s.submit(make_spec("high", iota_tokens(8, 100), 2, 5));
  Plan& plan = s.next_plan();
  ASSERT_EQ(plan.num_rows, 1);
  EXPECT_EQ(plan.req_ids[0], high);
  std::vector<int32_t> sampled(plan.num_samples, 7);
  s.advance(plan, sampled);
  EXPECT_EQ(s.request_stats(low).state, std::string("waiting"));
}

TEST(Batching, ConcurrentRequestsShareAPromptWhileTheFirstStillPrefills) {
  Scheduler s(small_config(4, 128));
  const auto prompt = iota_tokens(64);
  const int64_t a = s.submit(make_spec("a", prompt));
  step(s);
  step(s);  // two 16-token chunks of a are done and in the cache
  const int64_t b = s.submit(make_spec("b", prompt));
  Plan& plan = s.next_plan();
  EXPECT_EQ(s.request_stats(b).num_cached_tokens, 32);
  const int32_t row_a = row_of(plan, a), row_b = row_of(plan, b);
  ASSERT_GE(row_b, 0);
  EXPECT_EQ(plan.cached_lens[row_b], 32);
  for (int p = 0; p < 8; ++p)
    EXPECT_EQ(plan.page_table[row_a * plan.pages_per_row + p], plan.page_table[row_b * plan.pages_per_row + p]);
  const auto stats = s.stats();
  EXPECT_EQ(stats.prefix_hit_tokens, 32);
  EXPECT_EQ(stats.prefix_query_tokens, 128);
  s.check_invariants();
}

TEST(Batching, FullyCachedPromptStillComputesItsLastToken) {
  Scheduler s(small_config());
  const auto prompt = iota_tokens(16);  // exactly 4 pages
  s.submit(make_spec("a", prompt, 1));
  step(s);
  const int64_t b = s.submit(make_spec("b", prompt, 1));
  Plan& plan = s.next_plan();
  EXPECT_EQ(s.request_stats(b).num_cached_tokens, 12);  // the last page is recomputed
  EXPECT_EQ(plan.seq_lens[row_of(plan, b)], 16);
  EXPECT_EQ(plan.num_samples, 1);
}

TEST(Batching, BadInputThrowsAndLeavesTheSchedulerUsable) {
  Scheduler s(small_config());
  s.submit(make_spec("a", iota_tokens(8)));
  EXPECT_THROW(s.submit(make_spec("empty", {})), std::invalid_argument);
  EXPECT_THROW(s.submit(make_spec("long", iota_tokens(257))), std::invalid_argument);
  EXPECT_THROW(s.submit(make_spec("zero", iota_tokens(4), 0)), std::invalid_argument);
  EXPECT_THROW(s.submit(make_spec("a", iota_tokens(4))), std::invalid_argument);  // duplicate live rid
  EXPECT_THROW(s.submit(make_spec("neg", {1, -3})), std::invalid_argument);
  auto drafts = make_spec("drafts", iota_tokens(4));
  drafts.num_draft_tokens = 99;
  EXPECT_THROW(s.submit(drafts), std::invalid_argument);
  EXPECT_THROW(s.abort(12345), std::invalid_argument);
  EXPECT_EQ(s.num_unfinished(), 1);
  step(s);
  s.check_invariants();
  auto config = small_config();
  config.policy = "shortest_first";
  EXPECT_THROW(Scheduler{config}, std::invalid_argument);
  config = small_config(4, 1);
  EXPECT_THROW(Scheduler{config}, std::invalid_argument);
}

TEST(Batching, AbortFreesEverythingAndIsReportedOnce) {
  auto config = small_config();
  config.enable_prefix_cache = false;
  Scheduler s(config);
  const int64_t a = s.submit(make_spec("a", iota_tokens(30), 50));
  step(s);
  EXPECT_LT(s.stats().free_device_pages, 63);
  s.abort(a);
  EXPECT_EQ(s.stats().free_device_pages, 63);
  EXPECT_THROW(s.abort(a), std::invalid_argument);
  EXPECT_TRUE(s.has_unfinished());  // until the abort is reported
  auto finished = step(s);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].req_id, a);
  EXPECT_EQ(finished[0].reason, fsm::FinishReason::kAbort);
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_TRUE(step(s).empty());
  s.check_invariants();
}

TEST(Batching, MaxModelLenEndsARequestWithLength) {
  Scheduler s(small_config(4, 128));
  const int64_t a = s.submit(make_spec("a", iota_tokens(250), 100));
  std::vector<FinishedRequest> finished;
  for (int i = 0; i < 40 && finished.empty(); ++i) finished = step(s);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].reason, fsm::FinishReason::kLength);
  EXPECT_EQ(s.request_stats(a).num_output_tokens, 6);
}
