// The CPU drafters: prompt lookup (ngram) and suffix matching across a conversation's requests.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "draft/proposer.h"

using namespace lightspeed::draft;

namespace {

ProposerConfig ngram_config(int32_t k = 4) {
  ProposerConfig config;
  config.max_num_seqs = 4;
  config.num_speculative_tokens = k;
  config.min_match = 2;
  config.max_match = 6;
  return config;
}

// One proposal for `slot` with nothing in flight.
std::vector<int32_t> propose(const DraftProposer& p, int32_t slot, std::vector<int32_t> pending = {},
                             int32_t extra = 0) {
  const int32_t width = 16;
  std::vector<int32_t> out(width, -7), count(1);
  const std::vector<int32_t> slots{slot}, extras{extra}, counts{static_cast<int32_t>(pending.size())};
  pending.resize(8, 0);
  p.propose(slots, extras, counts, pending, 8, out, width, count);
  return std::vector<int32_t>(out.begin(), out.begin() + count[0]);
}

}  // namespace

TEST(DraftProposer, NgramProposesWhatFollowedTheLatestEarlierOccurrence) {
  DraftProposer p(ngram_config());
  // "1 2 3 4 5 ... 1 2 9 9 ... 1 2": the latest earlier "1 2" is followed by 9 9.
  p.start(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 1, 2, 9, 9, 8, 7, 1, 2}, 14, -1);
  EXPECT_EQ(propose(p, 0), (std::vector<int32_t>{9, 9, 8, 7}));
  // A longer match beats a more recent one: the tail "5 6 1 2" occurred first at the start.
  p.start(1, std::vector<int32_t>{5, 6, 1, 2, 3, 4, 7, 1, 2, 8, 8, 5, 6, 1, 2}, 15, -1);
  EXPECT_EQ(propose(p, 1), (std::vector<int32_t>{3, 4, 7, 1}));
  // No earlier occurrence of the tail: nothing.
  p.start(2, std::vector<int32_t>{1, 2, 3, 4}, 4, -1);
  EXPECT_TRUE(propose(p, 2).empty());
}

TEST(DraftProposer, PendingDraftsExtendTheContextAndTheProposal) {
  DraftProposer p(ngram_config(3));
  p.start(0, std::vector<int32_t>{10, 11, 12, 13, 14, 15, 16, 10, 11}, 9, -1);
  EXPECT_EQ(propose(p, 0), (std::vector<int32_t>{12, 13, 14}));
  // With 12 13 in flight, the proposal continues after them; extra=1 asks for one more token
  // (the first stands for the in-flight row's sample).
  EXPECT_EQ(propose(p, 0, {12, 13}, 1), (std::vector<int32_t>{14, 15, 16, 10}));
  p.commit(std::vector<int32_t>{0, 0, 0}, std::vector<int32_t>{12, 13, 99});
  EXPECT_TRUE(propose(p, 0).empty());  // "13 99" never occurred
}

TEST(DraftProposer, DraftLengthFollowsAcceptance) {
  DraftProposer p(ngram_config(8));
  p.start(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2}, 14, -1);
  EXPECT_EQ(p.draft_length(0), 8);
  p.observe(std::vector<int32_t>{0}, std::vector<int32_t>{8}, std::vector<int32_t>{1});
  EXPECT_EQ(p.draft_length(0), 2);
  EXPECT_EQ(propose(p, 0).size(), 2u);
  p.observe(std::vector<int32_t>{0}, std::vector<int32_t>{2}, std::vector<int32_t>{2});
  EXPECT_EQ(p.draft_length(0), 4);
  p.observe(std::vector<int32_t>{0}, std::vector<int32_t>{4}, std::vector<int32_t>{4});
  p.observe(std::vector<int32_t>{0}, std::vector<int32_t>{8}, std::vector<int32_t>{8});
  EXPECT_EQ(p.draft_length(0), 8);
  p.observe(std::vector<int32_t>{0}, std::vector<int32_t>{0}, std::vector<int32_t>{0});  // no drafts: no signal
  EXPECT_EQ(p.draft_length(0), 8);
}

TEST(DraftProposer, DraftsThatKeepMissingBackOff) {
  DraftProposer p(ngram_config(4));
  p.start(0, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 1, 2}, 10, -1);
  const std::vector<int32_t> slot{0}, four{4}, none{0}, one{1};
  p.observe(slot, four, none);  // one miss: drafting goes on
  EXPECT_EQ(p.backoff_remaining(0), 0);
  EXPECT_FALSE(propose(p, 0).empty());
  p.observe(slot, std::vector<int32_t>{1}, none);  // two in a row: a 4-token back-off
  EXPECT_EQ(p.backoff_remaining(0), DraftProposer::kFirstBackoffTokens);
  EXPECT_TRUE(propose(p, 0).empty());
  EXPECT_TRUE(propose(p, 0, {}, 1).empty());  // no guess for an in-flight sample either
  p.commit(std::vector<int32_t>{0, 0, 0, 0}, std::vector<int32_t>{3, 4, 5, 6});  // it counts committed tokens
  EXPECT_EQ(p.backoff_remaining(0), 0);
  EXPECT_FALSE(propose(p, 0).empty());
  p.observe(slot, one, none);  // a miss right after a back-off doubles it
  EXPECT_EQ(p.backoff_remaining(0), 2 * DraftProposer::kFirstBackoffTokens);
  for (int i = 0; i < 4; ++i) {
    p.commit(std::vector<int32_t>(DraftProposer::kMaxBackoffTokens, 0), std::vector<int32_t>(DraftProposer::kMaxBackoffTokens, 7));
    p.observe(slot, one, none);
  }
  EXPECT_EQ(p.backoff_remaining(0), DraftProposer::kMaxBackoffTokens);  // capped
  p.commit(std::vector<int32_t>(DraftProposer::kMaxBackoffTokens, 0), std::vector<int32_t>(DraftProposer::kMaxBackoffTokens, 7));
  p.observe(slot, four, std::vector<int32_t>{2});  // an accepted draft ends it all
  p.observe(slot, one, none);
  EXPECT_EQ(p.backoff_remaining(0), 0);  // one miss after acceptance: no back-off yet
  p.start(0, std::vector<int32_t>{1, 2, 3}, 3, -1);  // a new request starts clean
  EXPECT_EQ(p.backoff_remaining(0), 0);
}

TEST(DraftProposer, SuffixMatchesOutputsOfEarlierRequestsOfTheSameGroup) {
  auto config = ngram_config(6);
  config.method = "suffix";
  config.max_match = 12;
  config.max_spec_factor = 2.0;
  config.min_token_prob = 0.0;
  DraftProposer p(config);
  // Turn 1 wrote "def f ( x ) : return x" (ids 20..27) after its prompt.
  p.start(0, std::vector<int32_t>{1, 2, 3}, 3, /*group=*/7);
  p.commit(std::vector<int32_t>(8, 0), std::vector<int32_t>{20, 21, 22, 23, 24, 25, 26, 27});
  p.release(0);
  EXPECT_EQ(p.num_cached_requests(), 1);
  // Turn 2 of the same conversation starts re-emitting it: its own tokens do not hold it.
  p.start(1, std::vector<int32_t>{5, 5, 20, 21, 22}, 3, 7);
  EXPECT_EQ(propose(p, 1), (std::vector<int32_t>{23, 24, 25, 26, 27}));
  // Another conversation does not see it.
  p.start(2, std::vector<int32_t>{5, 5, 20, 21, 22}, 3, 8);
  EXPECT_TRUE(propose(p, 2).empty());
  // ngram never looks outside the request.
  DraftProposer ngram(ngram_config());
  ngram.start(0, std::vector<int32_t>{1, 2, 3, 20, 21, 22, 23}, 3, 7);
  ngram.release(0);
  ngram.start(1, std::vector<int32_t>{5, 5, 20, 21, 22}, 3, 7);
  EXPECT_TRUE(propose(ngram, 1).empty());
}

TEST(DraftProposer, SuffixStopsWhereMatchingPlacesDisagreeAndScalesWithTheMatch) {
  // Three earlier outputs continue "30 31" alike for two tokens, then differently.
  const std::vector<std::vector<int32_t>> outputs{{30, 31, 40, 41, 50, 51}, {30, 31, 40, 41, 60, 61},
                                                  {30, 31, 40, 41, 70, 71}};
  auto proposal = [&](double factor, double min_prob) {
    auto config = ngram_config(8);
    config.method = "suffix";
    config.max_match = 12;
    config.max_spec_factor = factor;
    config.min_token_prob = min_prob;
    DraftProposer p(config);
    for (const auto& out : outputs) {
      p.start(0, std::vector<int32_t>{1}, 1, 3);
      p.commit(std::vector<int32_t>(out.size(), 0), out);
      p.release(0);
    }
    p.start(1, std::vector<int32_t>{9, 9, 9, 9, 30, 31}, 4, 3);
    return propose(p, 1);
  };
  // A match of 2 allows 2 drafts at factor 1.
  EXPECT_EQ(proposal(1.0, 0.0), (std::vector<int32_t>{40, 41}));
  // At factor 4 the newest output is followed to its end...
  EXPECT_EQ(proposal(4.0, 0.0), (std::vector<int32_t>{40, 41, 70, 71}));
  // ...unless agreement matters: the third token splits the places 1:1:1, below 0.5.
  EXPECT_EQ(proposal(4.0, 0.5), (std::vector<int32_t>{40, 41}));
}

TEST(DraftProposer, CachedRequestsAreBounded) {
  auto config = ngram_config();
  config.method = "suffix";
  config.max_cached_requests = 2;
  DraftProposer p(config);
  for (int i = 0; i < 5; ++i) {
    p.start(0, std::vector<int32_t>{1}, 1, i % 2);
    p.commit(std::vector<int32_t>{0, 0, 0}, std::vector<int32_t>{i, i + 1, i + 2});
    p.release(0);
  }
  EXPECT_EQ(p.num_cached_requests(), 2);
}

TEST(DraftProposer, BadInputRaises) {
  auto config = ngram_config();
  config.method = "eagle";
  EXPECT_THROW(DraftProposer{config}, std::invalid_argument);
  config = ngram_config();
  config.max_match = 1;
  EXPECT_THROW(DraftProposer{config}, std::invalid_argument);
  DraftProposer p(ngram_config());
  EXPECT_THROW(p.start(9, std::vector<int32_t>{1}, 1, -1), std::invalid_argument);
  EXPECT_THROW(p.commit(std::vector<int32_t>{1}, std::vector<int32_t>{5}), std::invalid_argument);  // not bound
  EXPECT_TRUE(propose(p, 1).empty());  // an unbound slot proposes nothing
}
