// The one-plan-in-flight protocol and speculative decoding.
#include <gtest/gtest.h>

#include <stdexcept>

#include "test_util.h"

using namespace lightspeed;
using namespace lightspeed::testing;

TEST(Overlap, NextPlanReadsInputsFromTheInFlightSamples) {
  Scheduler s(small_config());
  const int64_t a = s.submit(make_spec("a", iota_tokens(8), 5));
  const int64_t b = s.submit(make_spec("b", iota_tokens(6, 100), 5));
  Plan& p0 = s.next_plan();
  ASSERT_EQ(p0.num_samples, 2);
  Plan& p1 = s.next_plan();  // p0 still in flight
  ASSERT_EQ(p1.num_decodes, 2);
  EXPECT_EQ(p1.req_ids[0], a);
  EXPECT_EQ(p1.positions[0], 8);
  EXPECT_EQ(p1.positions[1], 6);
  EXPECT_TRUE(p1.deferred_input_mask[0] && p1.deferred_input_mask[1]);
  EXPECT_EQ(p1.deferred_src_index[0], 0);
  EXPECT_EQ(p1.deferred_src_index[1], 1);
  EXPECT_THROW(s.next_plan(), std::invalid_argument);  // two in flight
  std::vector<int32_t> none;
  EXPECT_THROW(s.advance(p1, std::vector<int32_t>{1, 1}), std::invalid_argument);  // out of order
  s.advance(p0, std::vector<int32_t>{11, 21});
  Plan& p2 = s.next_plan();
  EXPECT_EQ(p2.positions[0], 9);
  EXPECT_EQ(p2.deferred_src_index[0], 0);
  s.advance(p1, std::vector<int32_t>{12, 22});
  auto out = s.output_token_ids(a);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end()), (std::vector<int32_t>{11, 12}));
  (void)p2;
  s.check_invariants();
}

TEST(Overlap, ARequestFinishedInStepNLosesItsStepNPlusOneRow) {
  Scheduler s(small_config());
  const int64_t a = s.submit(make_spec("a", iota_tokens(8), 50));
  const int64_t b = s.submit(make_spec("b", iota_tokens(8, 100), 50));
  Plan* in_flight = &s.next_plan();
  int32_t step_count = 0;
  bool a_done = false;
  while (s.has_unfinished() && step_count < 20) {
    Plan& next = s.next_plan();
    // a samples EOS (2) in step 2; its row in step 3 was already planned.
    std::vector<int32_t> sampled(in_flight->num_samples, 7);
    for (int32_t i = 0; i < in_flight->num_samples; ++i)
      if (in_flight->req_ids[in_flight->sample_batch_rows[i]] == a && step_count == 2) sampled[i] = 2;
    for (const auto& f : s.advance(*in_flight, sampled)) {
      EXPECT_EQ(f.req_id, a);
      EXPECT_EQ(f.reason, fsm::FinishReason::kStop);
      a_done = true;
      EXPECT_GE(row_of(next, a), 0);  // the stale row exists, and is discarded below
    }
    s.check_invariants();
    in_flight = &next;
    ++step_count;
    if (a_done) break;
  }
  ASSERT_TRUE(a_done);
  std::vector<int32_t> sampled(in_flight->num_samples, 7);
  EXPECT_TRUE(s.advance(*in_flight, sampled).empty());
  Plan& after = s.next_plan();
  EXPECT_EQ(row_of(after, a), -1);
  EXPECT_GE(row_of(after, b), 0);
  s.check_invariants();
}

TEST(Overlap, LengthLimitIsAnticipatedSoNoWastedRow) {
  Scheduler s(small_config());
  const int64_t a = s.submit(make_spec("a", iota_tokens(8), 2));
  Plan& p0 = s.next_plan();
  Plan& p1 = s.next_plan();  // a's 2nd token
  EXPECT_EQ(p1.num_rows, 1);
  s.advance(p0, std::vector<int32_t>{5});
  Plan& p2 = s.next_plan();  // a's 2nd token is its last: no 3rd row
  EXPECT_EQ(row_of(p2, a), -1);
  auto finished = s.advance(p1, std::vector<int32_t>{6});
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].reason, fsm::FinishReason::kLength);
  s.advance(p2, std::vector<int32_t>{});
  s.check_invariants();
}

TEST(SpecDecode, DraftRowsReserveAndReleasePages) {
  auto config = small_config();
  config.enable_prefix_cache = false;
  Scheduler s(config);
  auto spec = make_spec("a", iota_tokens(6), 20);
  spec.num_draft_tokens = 3;
  const int64_t a = s.submit(spec);
  step(s, 40);  // prompt: first token 40
  Plan& plan = s.next_plan();
  ASSERT_EQ(plan.num_decodes, 1);
  EXPECT_EQ(plan.num_decode_tokens, 4);
  EXPECT_EQ(plan.num_samples, 4);
  EXPECT_EQ(plan.input_ids[0], 40);
  EXPECT_EQ(plan.positions[3], 9);
  EXPECT_EQ(plan.seq_lens[0], 10);
  EXPECT_EQ(plan.pages_per_row, 3);
  EXPECT_EQ(s.stats().free_device_pages, 60);
  std::vector<int32_t> sampled{41, 42, 43, 44};
  EXPECT_THROW(s.advance(plan, sampled), std::invalid_argument);  // accepted_counts missing
  EXPECT_THROW(s.advance(plan, sampled, std::vector<int32_t>{5}), std::invalid_argument);
  s.advance(plan, sampled, std::vector<int32_t>{2});
  auto out = s.output_token_ids(a);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end()), (std::vector<int32_t>{40, 41, 42}));
  EXPECT_EQ(s.stats().free_device_pages, 61);  // KV 8 tokens: the third page went back
  Plan& next = s.next_plan();
  EXPECT_EQ(next.cached_lens[0], 8);
  EXPECT_EQ(next.input_ids[0], 42);
  EXPECT_EQ(next.seq_lens[0], 12);
  s.advance(next, std::vector<int32_t>{1, 1, 1, 1}, std::vector<int32_t>{4});
  EXPECT_EQ(s.request_stats(a).num_output_tokens, 7);
  s.check_invariants();
}

TEST(SpecDecode, DraftSlotsStopAtMaxModelLen) {
  auto config = small_config();
  config.max_model_len = 12;
  Scheduler s(config);
  auto spec = make_spec("a", iota_tokens(9), 20);
  spec.num_draft_tokens = 3;
  s.submit(spec);
  step(s, 40);  // 10 tokens known, KV 9
  Plan& plan = s.next_plan();
  EXPECT_EQ(plan.num_decode_tokens, 3);  // positions 9, 10, 11: nothing at 12
  EXPECT_EQ(plan.positions[2], 11);
  s.advance(plan, std::vector<int32_t>{1, 1, 1}, std::vector<int32_t>{3});
  EXPECT_FALSE(s.has_unfinished());  // 12 tokens: length
}

TEST(Overlap, APlanFromAnotherSchedulerIsRejected) {
  Scheduler a(small_config()), b(small_config());
  a.submit(make_spec("x", iota_tokens(4)));
  b.submit(make_spec("y", iota_tokens(4)));
  Plan& plan_a = a.next_plan();
  b.next_plan();
  EXPECT_THROW(b.advance(plan_a, std::vector<int32_t>{1}), std::invalid_argument);
  a.advance(plan_a, std::vector<int32_t>{1});
}
