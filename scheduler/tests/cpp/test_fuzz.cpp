// Property test: random submits, aborts, plans and advances (both protocols, speculative rows,
// cache-op acknowledgements) over random configs. After every event the scheduler recounts every
// page reference (free + owned = total on each tier, each reference has exactly one owner,
// finished requests own nothing). At the end of each episode, once everything is finished, every
// device and host page is free or held by the prefix cache alone.
//
// LIGHTSPEED_FUZZ_EVENTS sets the event count (default 10^5; the slow run uses 10^6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <random>
#include <map>
#include <set>
#include <stdexcept>

#include "test_util.h"

using namespace lightspeed;

namespace {

int64_t event_budget() {
  const char* env = std::getenv("LIGHTSPEED_FUZZ_EVENTS");
  return env ? std::atoll(env) : 100000;
}

// Paths the random walk must have taken, so that a green run means something.
struct Coverage {
  int64_t retractions = 0, load_backs = 0, write_backs = 0, deferred_rows = 0, speculative_rows = 0;
  int64_t aborts = 0, prefix_hits = 0, finished = 0;
  int64_t late_acks = 0, aborts_mid_copy = 0;  // async_copies: acks after advance(), aborts while loading
};

struct Episode {
  std::mt19937_64& rng;
  Scheduler s;
  std::set<int64_t> live;
  std::set<int64_t> aborted;  // aborted, not yet reported
  std::deque<Plan*> in_flight;
  std::vector<int64_t> unacked_copies;  // async_copies: steps whose copies have not "landed" yet
  // Device pages that copies not yet acknowledged write (load_back destinations) or read
  // (write_back sources), per step: no forward may read the former or overwrite either.
  std::map<int64_t, std::set<int32_t>> loading_pages, copied_out_pages;
  int64_t events = 0;
  int32_t next_rid = 0;

  Coverage& coverage;

  Episode(std::mt19937_64& r, const SchedulerConfig& config, Coverage& c) : rng(r), s(config), coverage(c) {}

  int32_t uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); }

  void submit() {
    const auto& config = s.config();
    RequestSpec spec;
    spec.rid = "r" + std::to_string(next_rid++);
    // A few shared prefixes over a tiny vocabulary: prefix hits, duplicate pages and collisions
    // of content under different parents all happen.
    const int32_t family = uniform(0, 3);
    const int32_t length = uniform(1, std::min(config.max_model_len, 4 * config.page_size + 9));
    for (int32_t i = 0; i < length; ++i) spec.token_ids.push_back(i < length / 2 ? (family * 7 + i) % 11 : uniform(0, 10));
    spec.max_new_tokens = uniform(1, 12);
    spec.eos_token_ids = {2};
    spec.stop_token_ids = uniform(0, 3) == 0 ? std::vector<int32_t>{5} : std::vector<int32_t>{};
    spec.ignore_eos = uniform(0, 4) == 0;
    spec.priority = uniform(-1, 1);
    spec.num_draft_tokens = config.max_num_draft_tokens > 0 ? uniform(0, config.max_num_draft_tokens) : 0;
    if (uniform(0, 30) == 0) spec.token_ids.clear();  // invalid: must throw and change nothing
    try {
      live.insert(s.submit(spec));
    } catch (const std::invalid_argument&) {
      // Empty prompts, or prompts larger than the device pool.
    }
  }

  void abort_one() {
    std::vector<int64_t> candidates;
    for (int64_t id : live)
      if (!aborted.count(id)) candidates.push_back(id);
    if (candidates.empty()) return;
    const int64_t id = candidates[uniform(0, static_cast<int32_t>(candidates.size()) - 1)];
    const std::string state = s.request_stats(id).state;
    if (s.config().async_copies && (state == "loading_prefix" || state == "retracting")) ++coverage.aborts_mid_copy;
    s.abort(id);  // reported by the next advance()
    aborted.insert(id);
    ++coverage.aborts;
  }

  void forget_copies(int64_t step) {
    loading_pages.erase(step);
    copied_out_pages.erase(step);
  }

  // The copies of a new plan start after every earlier forward and may run beside later ones.
  void check_copy_hazards(const Plan& plan) {
    const int32_t ps = s.config().page_size;
    std::set<int32_t> own_out;
    for (size_t i = 0; i < plan.write_back.size(); i += 2) own_out.insert(plan.write_back[i]);
    std::set<int32_t> own_in;
    for (size_t i = 1; i < plan.load_back.size(); i += 2) own_in.insert(plan.load_back[i]);
    for (int32_t b = 0; b < plan.num_rows; ++b) {
      const int32_t used = (plan.seq_lens[b] + ps - 1) / ps;
      for (int32_t p = 0; p < used; ++p) {
        const int32_t page = plan.page_table[b * plan.pages_per_row + p];
        ASSERT_EQ(own_in.count(page), 0u) << "a row reads a page its own plan is loading";
        for (const auto& [step, pages] : loading_pages)
          ASSERT_EQ(pages.count(page), 0u) << "a row reads page " << page << " still loading for step " << step;
      }
    }
    for (int32_t t = 0; t < plan.num_tokens; ++t) {
      const auto page = static_cast<int32_t>(plan.slot_mapping[t] / ps);
      if (own_out.count(page)) ASSERT_TRUE(plan.forward_waits_for_copies) << "forward overwrites a page being copied";
      if (!s.config().async_copies) continue;
      for (const auto& [step, pages] : copied_out_pages)
        ASSERT_EQ(pages.count(page), 0u) << "forward overwrites page " << page << " copied out by step " << step;
    }
    if (plan.has_copies) {
      loading_pages[plan.step_id] = own_in;
      // A forward that waits for its plan's copies proves them landed to every later plan.
      if (!plan.forward_waits_for_copies) copied_out_pages[plan.step_id] = own_out;
    }
  }

  void advance_oldest() {
    Plan& plan = *in_flight.front();
    in_flight.pop_front();
    if (!s.config().async_copies) forget_copies(plan.step_id);
    std::vector<int32_t> sampled(plan.num_samples);
    for (auto& token : sampled) token = uniform(0, 10);
    std::vector<int32_t> accepted;
    bool speculative = false;
    for (int32_t b = 0; b < plan.num_decodes; ++b) {
      accepted.push_back(uniform(1, plan.rows[b].num_samples));
      speculative |= plan.rows[b].num_samples > 1;
    }
    const auto& finished = s.advance(plan, sampled, speculative || uniform(0, 1) ? accepted : std::vector<int32_t>{});
    coverage.finished += static_cast<int64_t>(finished.size());
    for (const auto& f : finished) {
      ASSERT_EQ(live.erase(f.req_id), 1u) << "reported twice or unknown";
      ASSERT_EQ(aborted.erase(f.req_id), f.reason == fsm::FinishReason::kAbort ? 1u : 0u);
    }
  }

  // Every plan agrees with itself: the page table (filled incrementally) maps each token to the
  // slot the row computed, rows are padded with page 0, no two new tokens share a KV slot, and
  // deferred inputs point into the in-flight plan's samples.
  void check_plan(const Plan& plan, int32_t previous_samples) {
    const int32_t ps = s.config().page_size;
    std::set<int64_t> written;
    ASSERT_EQ(plan.query_start_loc[0], 0);
    for (int32_t b = 0; b < plan.num_rows; ++b) {
      const int32_t begin = plan.query_start_loc[b], end = plan.query_start_loc[b + 1];
      ASSERT_EQ(end - begin, plan.seq_lens[b] - plan.cached_lens[b]);
      const int32_t used = (plan.seq_lens[b] + ps - 1) / ps;
      for (int32_t p = 0; p < plan.pages_per_row; ++p) {
        const int32_t page = plan.page_table[b * plan.pages_per_row + p];
        ASSERT_EQ(page == 0, p >= used) << "row " << b << " page " << p;
      }
      for (int32_t t = begin; t < end; ++t) {
        const int64_t pos = plan.positions[t];
        ASSERT_EQ(pos, plan.cached_lens[b] + (t - begin));
        ASSERT_EQ(plan.slot_mapping[t], int64_t(plan.page_table[b * plan.pages_per_row + pos / ps]) * ps + pos % ps);
        ASSERT_TRUE(written.insert(plan.slot_mapping[t]).second) << "two tokens write one KV slot";
        if (plan.deferred_input_mask[t]) {
          ASSERT_GE(plan.deferred_src_index[t], 0);
          ASSERT_LT(plan.deferred_src_index[t], previous_samples);
        }
      }
    }
    for (int32_t i = 0; i < plan.num_samples; ++i) {
      const int32_t row = plan.sample_batch_rows[i];
      ASSERT_GE(plan.logits_indices[i], plan.query_start_loc[row]);
      ASSERT_LT(plan.logits_indices[i], plan.query_start_loc[row + 1]);
    }
  }

  // Copies land in any order, some long after their plan was advanced.
  void ack_copies() {
    if (unacked_copies.empty()) return;
    const auto i = static_cast<size_t>(uniform(0, static_cast<int32_t>(unacked_copies.size()) - 1));
    s.copies_done(unacked_copies[i]);
    forget_copies(unacked_copies[i]);
    ++coverage.late_acks;
    unacked_copies.erase(unacked_copies.begin() + static_cast<ptrdiff_t>(i));
    EXPECT_THROW(s.copies_done(-5), std::invalid_argument);
  }

  void event() {
    const int32_t dice = uniform(0, 99);
    const bool overlap = uniform(0, 1) == 1;
    if (dice < 20) {
      submit();
    } else if (dice < 24) {
      abort_one();
    } else if (dice < 34 && s.config().async_copies) {
      ack_copies();
    } else if (in_flight.empty() || (overlap && in_flight.size() < 2)) {
      const int32_t previous_samples = in_flight.empty() ? 0 : in_flight.back()->num_samples;
      Plan& plan = s.next_plan();
      check_plan(plan, previous_samples);
      check_copy_hazards(plan);
      in_flight.push_back(&plan);
      if (plan.has_copies && s.config().async_copies) unacked_copies.push_back(plan.step_id);
      coverage.load_backs += static_cast<int64_t>(plan.load_back.size() / 2);
      coverage.write_backs += static_cast<int64_t>(plan.write_back.size() / 2);
      for (int32_t t = 0; t < plan.num_tokens; ++t) coverage.deferred_rows += plan.deferred_input_mask[t];
      for (int32_t b = 0; b < plan.num_decodes; ++b) coverage.speculative_rows += plan.rows[b].num_samples > 1;
    } else {
      advance_oldest();
    }
    ++events;
    s.check_invariants();
  }

  void drain() {
    for (int64_t id : live)
      if (!aborted.count(id)) s.abort(id);
    aborted.insert(live.begin(), live.end());
    while (!in_flight.empty()) advance_oldest();
    // Queued write-throughs are emitted and acknowledged by (possibly empty) plans.
    for (int i = 0; s.has_pending_copies() || s.has_unfinished(); ++i) {
      ASSERT_LT(i, 10000) << "copies never drain";
      while (!unacked_copies.empty()) ack_copies();
      Plan& plan = s.next_plan();
      if (plan.has_copies && s.config().async_copies) unacked_copies.push_back(plan.step_id);
      in_flight.push_back(&plan);
      advance_oldest();
    }
    s.check_invariants();
    ASSERT_TRUE(live.empty());
    coverage.retractions += s.stats().num_retractions;
    coverage.prefix_hits += s.stats().prefix_hit_tokens;
    const auto stats = s.stats();
    EXPECT_EQ(stats.free_device_pages + stats.cached_device_pages, stats.num_device_pages - 1);
    EXPECT_EQ(stats.unreferenced_cached_device_pages, stats.cached_device_pages);  // no request is left
    EXPECT_EQ(stats.free_host_pages + stats.cached_host_pages, std::max(stats.num_host_pages - 1, 0));
    EXPECT_EQ(stats.num_writing_back, 0);
    EXPECT_EQ(stats.num_copy_batches, 0);
  }
};

SchedulerConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  SchedulerConfig config;
  config.page_size = 1 << pick(0, 3);
  config.num_device_pages = pick(8, 48);
  config.num_host_pages = pick(2, 48);
  config.max_num_seqs = pick(1, 8);
  config.max_num_batched_tokens = pick(4, 64);
  config.chunked_prefill_size = pick(1, 32);
  config.max_model_len = pick(8, 96);
  config.policy = pick(0, 3) == 0 ? "prefill_first" : "decode_first";
  config.enable_prefix_cache = pick(0, 4) != 0;
  config.max_num_draft_tokens = pick(0, 1) ? pick(1, 3) : 0;
  config.async_copies = pick(0, 1) == 1;
  config.max_write_through_pages = pick(1, 16);
  if (pick(0, 9) == 0) config.num_host_pages = 0;  // host tier off
  return config;
}

}  // namespace

TEST(Fuzz, RandomEventsKeepEveryInvariant) {
  std::mt19937_64 rng(20261129);
  const int64_t budget = event_budget();
  int64_t events = 0;
  int32_t episodes = 0;
  Coverage coverage;
  while (events < budget) {
    Episode episode(rng, random_config(rng), coverage);
    const int64_t length = std::min<int64_t>(2000, budget - events);
    while (episode.events < length) {
      episode.event();
      if (::testing::Test::HasFatalFailure()) return;
    }
    episode.drain();
    events += episode.events;
    ++episodes;
  }
  EXPECT_GE(events, budget);
  std::printf("fuzz: %lld events, %d episodes, %lld finished, %lld aborts, %lld retractions, %lld load-backs, "
              "%lld write-backs, %lld deferred inputs, %lld speculative rows, %lld prefix-hit tokens\n",
              static_cast<long long>(events), episodes, static_cast<long long>(coverage.finished),
              static_cast<long long>(coverage.aborts), static_cast<long long>(coverage.retractions),
              static_cast<long long>(coverage.load_backs), static_cast<long long>(coverage.write_backs),
              static_cast<long long>(coverage.deferred_rows), static_cast<long long>(coverage.speculative_rows),
              static_cast<long long>(coverage.prefix_hits));
  std::printf("fuzz: %lld late copy acknowledgements, %lld aborts while a copy was in flight\n",
              static_cast<long long>(coverage.late_acks), static_cast<long long>(coverage.aborts_mid_copy));
  EXPECT_GT(coverage.retractions, 0);
  EXPECT_GT(coverage.load_backs, 0);
  EXPECT_GT(coverage.write_backs, 0);
  EXPECT_GT(coverage.deferred_rows, 0);
  EXPECT_GT(coverage.speculative_rows, 0);
  EXPECT_GT(coverage.aborts, 0);
  EXPECT_GT(coverage.prefix_hits, 0);
  EXPECT_GT(coverage.late_acks, 0);
  EXPECT_GT(coverage.aborts_mid_copy, 0);
}
