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

namespace {
// Drafts for every slot: `count` tokens each, token ids 100 + slot * 10 + j.
struct Drafts {
  std::vector<int32_t> counts, tokens;
  int32_t width;
  Drafts(const SchedulerConfig& config, int32_t count, int32_t width_ = 4)
      : counts(config.max_num_seqs, count), tokens(config.max_num_seqs * width_), width(width_) {
    for (int32_t slot = 0; slot < config.max_num_seqs; ++slot)
      for (int32_t j = 0; j < width; ++j) tokens[slot * width + j] = 100 + slot * 10 + j;
  }
  DraftInput input() const { return DraftInput{counts, tokens, width}; }
};
}  // namespace

TEST(SpecDecode, PerStepDraftCountsAndTokensComeFromTheDrafter) {
  auto config = small_config();
  config.max_num_draft_tokens = 5;
  Scheduler s(config);
  const int64_t a = s.submit(make_spec("a", iota_tokens(6), 20));
  step(s, 40);
  Drafts drafts(config, 3);
  Plan& plan = s.next_plan(drafts.input());
  const int32_t slot = plan.req_slots[0];
  ASSERT_EQ(plan.num_decode_tokens, 4);
  EXPECT_EQ(plan.input_ids[0], 40);
  for (int32_t j = 1; j < 4; ++j) EXPECT_EQ(plan.input_ids[j], 100 + slot * 10 + j - 1);
  s.advance(plan, std::vector<int32_t>{101, 102, 103, 104}, std::vector<int32_t>{2});
  EXPECT_EQ(plan.appended_counts[0], 2);
  drafts.counts[slot] = 0;  // the next step runs without drafts
  Plan& plain = s.next_plan(drafts.input());
  EXPECT_EQ(plain.num_decode_tokens, 1);
  s.advance(plain, std::vector<int32_t>{7});
  EXPECT_EQ(s.request_stats(a).num_output_tokens, 4);
  // Malformed drafts raise and change nothing.
  const int64_t steps = s.stats().num_steps;
  drafts.counts[slot] = 6;  // > max_num_draft_tokens
  EXPECT_THROW(s.next_plan(drafts.input()), std::invalid_argument);
  drafts.counts[slot] = 5;  // wider than the token rows
  EXPECT_THROW(s.next_plan(drafts.input()), std::invalid_argument);
  drafts.counts.pop_back();
  EXPECT_THROW(s.next_plan(DraftInput{drafts.counts, {}, 0}), std::invalid_argument);
  EXPECT_EQ(s.stats().num_steps, steps);
  s.check_invariants();
}

TEST(SpecDecode, DraftsStopWhereTheOutputLimitEndsTheRequest) {
  auto config = small_config();
  Scheduler s(config);
  s.submit(make_spec("a", iota_tokens(6), 3));
  step(s, 40);  // one output; two more allowed
  Plan& plan = s.next_plan(Drafts(config, 4).input());
  EXPECT_EQ(plan.num_decode_tokens, 2);  // one draft + the bonus token reach the limit
  auto finished = s.advance(plan, std::vector<int32_t>{1, 1}, std::vector<int32_t>{2});
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].reason, fsm::FinishReason::kLength);
}

// Under overlap a speculative request gets a row in every plan: the row behind an in-flight
// speculative row starts where all its drafts would end (provisional); advance() corrects the
// bookkeeping, so each row's true start is always the request's known length minus one.
TEST(SpecDecode, SpeculativeRowsKeepARowEveryStepUnderOverlap) {
  auto config = small_config();
  config.max_num_draft_tokens = 3;
  config.enable_prefix_cache = false;
  Scheduler s(config);
  const int64_t a = s.submit(make_spec("a", iota_tokens(6), 200));
  step(s, 40);
  Drafts drafts(config, 3);
  const std::vector<int32_t> accept_pattern{4, 1, 2, 4, 4, 3, 1, 1, 4, 2};
  Plan* in_flight = &s.next_plan(drafts.input());
  int32_t shift = 0;  // what the in-flight row's rejections move the next row by
  std::vector<int32_t> expected{40};
  for (size_t step_index = 0; step_index < accept_pattern.size(); ++step_index) {
    Plan& next = s.next_plan(drafts.input());
    ASSERT_EQ(next.num_decodes, 1) << "step " << step_index;
    EXPECT_EQ(next.num_decode_tokens, 4);
    EXPECT_TRUE(next.deferred_input_mask[0]);
    EXPECT_TRUE(next.rows[0].provisional);
    EXPECT_EQ(next.deferred_src_index[0], 3);  // the in-flight row's last sample
    const int32_t accepted = accept_pattern[step_index];
    const auto known_before = static_cast<int32_t>(6 + expected.size());
    // The in-flight row's true start is the known length minus one.
    EXPECT_EQ(in_flight->rows[0].kv_start - shift, known_before - 1);
    std::vector<int32_t> sampled(4);
    for (int32_t j = 0; j < 4; ++j) sampled[j] = 50 + static_cast<int32_t>(step_index) * 4 + j;
    s.advance(*in_flight, sampled, std::vector<int32_t>{accepted});
    EXPECT_EQ(in_flight->appended_counts[0], accepted);
    for (int32_t j = 0; j < accepted; ++j) expected.push_back(sampled[j]);
    shift = 4 - accepted;
    // The next row was planned as if all four were accepted.
    EXPECT_EQ(next.rows[0].kv_start - shift, known_before - 1 + accepted);
    s.check_invariants();
    in_flight = &next;
  }
  s.advance(*in_flight, std::vector<int32_t>{9, 9, 9, 9}, std::vector<int32_t>{1});
  expected.push_back(9);
  auto out = s.output_token_ids(a);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.end()), expected);
  // Synchronous again: the row starts at the true KV end, and the draft tail's pages went back.
  Plan& sync = s.next_plan();
  EXPECT_FALSE(sync.rows[0].provisional);
  EXPECT_EQ(sync.cached_lens[0], static_cast<int32_t>(6 + expected.size()) - 1);
  s.advance(sync, std::vector<int32_t>{9});
  s.check_invariants();
}

TEST(SpecDecode, RetractionWithASpeculativeRowInFlightSavesOnlyKnownKv) {
  auto config = small_config(4, 12, 64);  // 11 usable device pages
  config.max_num_draft_tokens = 3;
  config.enable_prefix_cache = false;
  Scheduler s(config);
  // Each request alone fits (14 + 20 tokens + 3 drafts: 10 pages); both together do not.
  const int64_t a = s.submit(make_spec("a", iota_tokens(14), 20));
  const int64_t b = s.submit(make_spec("b", iota_tokens(14, 60), 20, /*priority=*/1));
  step(s, 40);
  step(s, 40);
  Drafts drafts(config, 3);
  Plan* in_flight = &s.next_plan(drafts.input());
  bool retracted = false;
  for (int i = 0; i < 30 && !retracted; ++i) {
    Plan& next = s.next_plan(drafts.input());
    retracted = s.stats().num_retractions > 0;
    std::vector<int32_t> sampled(in_flight->num_samples, 7);
    std::vector<int32_t> accepted(in_flight->num_decodes, 1);
    s.advance(*in_flight, sampled, accepted);
    s.check_invariants();
    in_flight = &next;
  }
  ASSERT_TRUE(retracted);
  EXPECT_EQ(std::string(s.request_stats(a).state).rfind("retract", 0), 0u);
  // Run to completion: a comes back and its outputs continue where the accepted ones ended.
  for (int i = 0; i < 400 && in_flight != nullptr; ++i) {
    std::vector<int32_t> sampled(in_flight->num_samples, 7);
    std::vector<int32_t> accepted(in_flight->num_decodes, 1);
    s.advance(*in_flight, sampled, accepted);
    s.check_invariants();
    in_flight = s.has_unfinished() ? &s.next_plan(drafts.input()) : nullptr;
  }
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_EQ(s.request_stats(a).num_output_tokens, 20);
  (void)b;
}

TEST(SpecDecode, LookaheadPagesAreReservedAndInThePageTable) {
  auto config = small_config();
  config.num_lookahead_tokens = 6;
  config.enable_prefix_cache = false;
  Scheduler s(config);
  s.submit(make_spec("a", iota_tokens(6), 20));
  step(s, 40);  // 7 tokens known, KV 6
  Plan& plan = s.next_plan();
  EXPECT_EQ(plan.seq_lens[0], 7);
  EXPECT_EQ(plan.rows[0].lookahead, 6);
  EXPECT_EQ(plan.pages_per_row, 4);  // 13 tokens of KV room: pages 0..3
  for (int32_t p = 0; p < 4; ++p) EXPECT_GT(plan.page_table[p], 0);
  EXPECT_EQ(s.stats().free_device_pages, 63 - 4);
  s.advance(plan, std::vector<int32_t>{1});
  s.check_invariants();
}
