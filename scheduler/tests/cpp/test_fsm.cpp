// Each lifecycle transition moves or releases exactly the resources the states say.
#include <gtest/gtest.h>

#include <type_traits>

#include "fsm/transitions.h"

using namespace lightspeed;

namespace {
kv::PageList pages(kv::PagePool& pool, int32_t count) {
  kv::PageList list(pool, count);
  for (int32_t i = 0; i < count; ++i) list.push_owned(pool.allocate());
  return list;
}
}  // namespace

static_assert(!std::is_copy_constructible_v<fsm::Decoding>, "states own pages: move-only");
static_assert(!std::is_copy_constructible_v<fsm::RequestState>);
static_assert(std::is_nothrow_move_constructible_v<fsm::Prefilling>);

TEST(Fsm, AdmitThenChunksThenDecode) {
  kv::PagePool device(16);
  fsm::Prefilling prefilling = fsm::admit(fsm::Waiting{}, pages(device, 2), 4);
  EXPECT_EQ(prefilling.num_computed, 4);
  auto next = fsm::chunk_scheduled(std::move(prefilling), 3, 10);
  ASSERT_TRUE(std::holds_alternative<fsm::Prefilling>(next));
  auto last = fsm::chunk_scheduled(std::get<fsm::Prefilling>(std::move(next)), 3, 10);
  ASSERT_TRUE(std::holds_alternative<fsm::Decoding>(last));
  const auto& decoding = std::get<fsm::Decoding>(last);
  EXPECT_EQ(decoding.kv_len, 10);
  EXPECT_EQ(decoding.device_pages.size(), 2u);
  EXPECT_EQ(device.num_free(), 13);
}

TEST(Fsm, LoadingPrefixReleasesHostPinsWhenCopied) {
  kv::PagePool device(8), host(8);
  auto loading = fsm::admit_loading(fsm::Waiting{}, pages(device, 2), pages(host, 2), 8);
  EXPECT_EQ(host.num_free(), 5);
  fsm::Prefilling prefilling = fsm::copy_done(std::move(loading));
  EXPECT_EQ(host.num_free(), 7);
  EXPECT_EQ(prefilling.device_pages.size(), 2u);
  EXPECT_EQ(prefilling.num_computed, 8);
}

TEST(Fsm, RetractToHostGivesUpDeviceAndReadmitLoadsBack) {
  kv::PagePool device(8), host(8);
  fsm::Decoding decoding{pages(device, 3), 11};
  fsm::Retracting retracting = fsm::retract_to_host(std::move(decoding), pages(host, 3), 11);
  EXPECT_EQ(device.num_free(), 7);
  fsm::Retracted retracted = fsm::copy_done(std::move(retracting));
  EXPECT_EQ(retracted.num_saved, 11);
  EXPECT_EQ(host.num_free(), 4);
  fsm::LoadingPrefix loading = fsm::readmit(std::move(retracted), pages(device, 3));
  EXPECT_EQ(loading.num_computed, 11);
  fsm::Prefilling prefilling = fsm::copy_done(std::move(loading));
  EXPECT_EQ(host.num_free(), 7);
  EXPECT_EQ(device.num_free(), 4);
  EXPECT_EQ(prefilling.num_computed, 11);
}

TEST(Fsm, RetractDropReleasesEverything) {
  kv::PagePool device(8);
  fsm::Prefilling prefilling{pages(device, 4), 13};
  fsm::Waiting waiting = fsm::retract_drop(std::move(prefilling));
  (void)waiting;
  EXPECT_EQ(device.num_free(), 7);
}

TEST(Fsm, FinishingADecodeReleasesItsPages) {
  kv::PagePool device(8);
  fsm::Decoding decoding{pages(device, 2), 5};
  fsm::RequestState state = fsm::finish(std::move(decoding), fsm::FinishReason::kLength);
  EXPECT_EQ(device.num_free(), 7);  // the prefix cache holds its own references, not the request
  EXPECT_EQ(std::get<fsm::Finished>(state).reason, fsm::FinishReason::kLength);
}

TEST(Fsm, AbortFromAnyLiveStateFreesEverythingAtOnce) {
  kv::PagePool device(16), host(16);
  fsm::RequestState states[] = {
      fsm::Waiting{},
      fsm::LoadingPrefix{pages(device, 1), pages(host, 1), 4},
      fsm::Prefilling{pages(device, 2), 3},
      fsm::Decoding{pages(device, 3), 9},
      fsm::Retracting{pages(host, 2), 7},
      fsm::Retracted{pages(host, 2), 7},
  };
  EXPECT_EQ(device.num_free(), 9);
  EXPECT_EQ(host.num_free(), 10);
  for (auto& state : states) {
    std::visit(
        [&](auto&& s) {
          using S = std::decay_t<decltype(s)>;
          if constexpr (!std::is_same_v<S, fsm::Finished> && !std::is_same_v<S, fsm::Aborted>)
            state = fsm::abort(std::move(s));
        },
        std::move(state));
    EXPECT_TRUE(std::holds_alternative<fsm::Aborted>(state));
  }
  EXPECT_EQ(device.num_free(), 15);
  EXPECT_EQ(host.num_free(), 15);
}

TEST(Fsm, StateNamesAreStable) {
  fsm::RequestState state = fsm::Waiting{};
  EXPECT_STREQ(fsm::state_name(state), "waiting");
  state = fsm::Aborted{};
  EXPECT_STREQ(fsm::state_name(state), "aborted");
  EXPECT_STREQ(fsm::reason_name(fsm::FinishReason::kLength), "length");
}
