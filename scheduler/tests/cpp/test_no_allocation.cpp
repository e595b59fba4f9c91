// Steady-state decode steps do no heap allocation: a counting global operator new proves it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace lightspeed;
using namespace lightspeed::testing;

namespace {

SchedulerConfig config_of(int32_t num_device_pages, int32_t max_num_seqs) {
  SchedulerConfig config;
  config.page_size = 16;
  config.num_device_pages = num_device_pages;
  config.num_host_pages = 64;
  config.max_num_seqs = max_num_seqs;
  config.max_num_batched_tokens = 8192;
  config.max_model_len = 8192;
  return config;
}

int64_t allocations_in_decode_steps(bool overlap) {
  Scheduler s(config_of(8192, 64));
  for (int i = 0; i < 64; ++i) {
    auto spec = make_spec("r" + std::to_string(i), iota_tokens(500, 1000 * i + 10), 100000);
    spec.ignore_eos = true;
    s.submit(spec);
  }
  std::vector<int32_t> sampled(8192, 7);
  auto run = [&](int steps) {
    Plan* in_flight = nullptr;
    for (int i = 0; i < steps; ++i) {
      Plan& plan = s.next_plan();
      if (overlap) {
        if (in_flight) s.advance(*in_flight, std::span<const int32_t>(sampled.data(), in_flight->num_samples));
        in_flight = &plan;
      } else {
        s.advance(plan, std::span<const int32_t>(sampled.data(), plan.num_samples));
      }
    }
    if (in_flight) s.advance(*in_flight, std::span<const int32_t>(sampled.data(), in_flight->num_samples));
  };
  run(50);  // admission and prefill allocate; decoding must not
  g_allocations = 0;
  g_counting = true;
  run(300);  // crosses page boundaries: 300 tokens is ~19 pages per request
  g_counting = false;
  EXPECT_EQ(s.stats().num_running, 64);
  return g_allocations.load();
}

// Decode steps while requests wait behind a full batch with cached prefixes larger than the free
// pages: every plan runs the queue-aware eviction's protection (scheduler_eviction.cpp).
int64_t allocations_with_a_protected_waiting_queue() {
  Scheduler s(config_of(1024, 8));
  std::vector<int32_t> sampled(8192, 7);
  auto step = [&] {
    Plan& plan = s.next_plan();
    s.advance(plan, std::span<const int32_t>(sampled.data(), plan.num_samples));
  };
  const auto shared = iota_tokens(2000, 10);  // cached first: the waiting requests match it
  s.submit(make_spec("shared", shared, 1));
  while (s.has_unfinished()) step();
  for (int i = 0; i < 8; ++i) {
    auto spec = make_spec("run" + std::to_string(i), iota_tokens(500, 100000 + 1000 * i), 100000);
    spec.ignore_eos = true;
    s.submit(spec);
  }
  for (int i = 0; i < 16; ++i) {
    auto tokens = shared;
    tokens.push_back(50000 + i);
    s.submit(make_spec("wait" + std::to_string(i), tokens, 1));
  }
  for (int i = 0; i < 50; ++i) step();  // admission and prefill allocate
  g_allocations = 0;
  g_counting = true;
  for (int i = 0; i < 300; ++i) step();
  g_counting = false;
  EXPECT_EQ(s.stats().num_running, 8);
  EXPECT_EQ(s.stats().num_waiting, 16);
  return g_allocations.load();
}

}  // namespace

TEST(NoAllocation, DecodeStepsWithAProtectedWaitingQueue) {
  EXPECT_EQ(allocations_with_a_protected_waiting_queue(), 0);
}

TEST(NoAllocation, SynchronousDecodeSteps) { EXPECT_EQ(allocations_in_decode_steps(false), 0); }

TEST(NoAllocation, OverlappedDecodeSteps) { EXPECT_EQ(allocations_in_decode_steps(true), 0); }
