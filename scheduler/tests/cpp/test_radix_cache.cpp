#include "prefix/radix_cache.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "prefix/flat_map.h"

using lightspeed::kv::PagePool;
using lightspeed::prefix::FlatKeyMap;
using lightspeed::prefix::RadixCache;

namespace {

constexpr int32_t kPage = 4;

struct CacheFixture : ::testing::Test {
  PagePool device{16};
  PagePool host{16};
  RadixCache cache{device, host, kPage};

  // Inserts `num_pages` pages of `tokens` as a fresh request would; returns the node path.
  std::vector<int32_t> insert_prompt(const std::vector<int32_t>& tokens, int32_t num_pages) {
    std::vector<int32_t> path;
    int32_t parent = RadixCache::kRoot;
    for (int32_t i = 0; i < num_pages; ++i) {
      const int32_t page = device.allocate();
      int32_t cached = -1;
      const int32_t node = cache.insert(parent, tokens.data() + i * kPage, page, &cached);
      EXPECT_EQ(cached, page);
      device.release(page);  // the "request" finishes: the cache is the sole owner
      path.push_back(node);
      parent = node;
    }
    cache.check_invariants();
    return path;
  }
};

std::vector<int32_t> seq(int32_t n, int32_t first) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

}  // namespace

TEST(FlatKeyMap, InsertFindEraseWithCollidingHomes) {
  FlatKeyMap map(8);
  // Keys sharing low bits probe into each other; erase must keep the rest findable.
  const uint64_t base = 1ull << 40;
  for (uint64_t i = 1; i <= 8; ++i) map.insert(base * i + 3, static_cast<int32_t>(i));
  map.erase(base * 2 + 3);
  map.erase(base * 5 + 3);
  for (uint64_t i = 1; i <= 8; ++i) {
    const int32_t expected = (i == 2 || i == 5) ? -1 : static_cast<int32_t>(i);
    EXPECT_EQ(map.find(base * i + 3), expected) << i;
  }
  EXPECT_EQ(map.size(), 6u);
}

TEST_F(CacheFixture, MatchesWholePagesAndStopsAtTheFirstDifference) {
  const auto tokens = seq(12, 100);
  insert_prompt(tokens, 3);
  std::vector<int32_t> path;
  auto hit = cache.match(tokens.data(), 3, path);
  EXPECT_EQ(hit.num_device, 3);
  EXPECT_EQ(path.size(), 3u);
  hit = cache.match(tokens.data(), 2, path);  // capped by the caller
  EXPECT_EQ(hit.num_device, 2);
  auto other = tokens;
  other[5] = 999;  // second page differs
  hit = cache.match(other.data(), 3, path);
  EXPECT_EQ(hit.num_device, 1);
  // Same page content under a different parent is a different prefix.
  auto shifted = seq(12, 104);
  hit = cache.match(shifted.data(), 2, path);
  EXPECT_EQ(hit.num_device, 0);
}

TEST_F(CacheFixture, DuplicateInsertReturnsTheCachedPage) {
  const auto tokens = seq(4, 1);
  const int32_t first = device.allocate();
  int32_t cached = -1;
  const int32_t node = cache.insert(RadixCache::kRoot, tokens.data(), first, &cached);
  const int32_t second = device.allocate();
  EXPECT_EQ(cache.insert(RadixCache::kRoot, tokens.data(), second, &cached), node);
  EXPECT_EQ(cached, first);  // caller switches to `first` and frees `second`
  EXPECT_EQ(device.refcount(second), 1);
  device.release(first);
  device.release(second);
  cache.check_invariants();
}

TEST_F(CacheFixture, ReferencedPagesAreNotEvicted) {
  const auto tokens = seq(8, 1);
  auto path = insert_prompt(tokens, 2);
  const int32_t leaf_page = cache.node(path[1]).device_page;
  device.retain(leaf_page);  // a running request shares the leaf: it locks the whole path
  EXPECT_EQ(cache.evict_device(2), 0);
  device.release(leaf_page);
  EXPECT_EQ(cache.evict_device(2), 2);
  EXPECT_EQ(cache.num_nodes(), 0);
  EXPECT_EQ(device.num_free(), 15);
  cache.check_invariants();
}

TEST_F(CacheFixture, EvictsLeastRecentlyUsedLeavesFirst) {
  const auto a = seq(8, 1), b = seq(8, 50);
  auto path_a = insert_prompt(a, 2);
  auto path_b = insert_prompt(b, 2);
  std::vector<int32_t> path;
  cache.match(a.data(), 2, path);  // a is now the most recent
  EXPECT_EQ(cache.evict_device(1), 1);
  EXPECT_TRUE(cache.node(path_a[1]).alive);
  EXPECT_FALSE(cache.node(path_b[1]).alive);  // b's leaf went, not its parent
  EXPECT_TRUE(cache.node(path_b[0]).alive);
  EXPECT_EQ(cache.evict_device(2), 2);  // then b's parent, then a's leaf
  EXPECT_TRUE(cache.node(path_a[0]).alive);
  cache.check_invariants();
}

TEST_F(CacheFixture, RetainedPrefixOutlivesPlainLruForItsSweeps) {
  const auto session = seq(8, 1), plain = seq(8, 50), later = seq(8, 100);
  auto path_s = insert_prompt(session, 2);
  std::vector<int32_t> path;
  cache.match(session.data(), 2, path, /*retention=*/1);  // a session's request: one extra sweep
  auto path_p = insert_prompt(plain, 2);                   // more recent, but plain
  // Plain LRU would drop the session's prefix first; its retention sends it to the MRU end once.
  EXPECT_EQ(cache.evict_device(2), 2);
  EXPECT_TRUE(cache.node(path_s[0]).alive && cache.node(path_s[1]).alive);
  EXPECT_FALSE(cache.node(path_p[0]).alive || cache.node(path_p[1]).alive);
  cache.check_invariants();
  // The leaf's sweep is spent: it is the oldest now and goes, with the newer prompt's leaf. The
  // parent was never reached (its child held it), so it still has its sweep and outlives the
  // newer prompt's parent; then it goes too.
  auto path_l = insert_prompt(later, 2);
  EXPECT_EQ(cache.evict_device(2), 2);
  EXPECT_FALSE(cache.node(path_s[1]).alive || cache.node(path_l[1]).alive);
  EXPECT_TRUE(cache.node(path_s[0]).alive && cache.node(path_l[0]).alive);
  EXPECT_EQ(cache.evict_device(1), 1);
  EXPECT_TRUE(cache.node(path_s[0]).alive);
  EXPECT_FALSE(cache.node(path_l[0]).alive);
  EXPECT_EQ(cache.evict_device(1), 1);
  EXPECT_EQ(cache.num_nodes(), 0);
  cache.check_invariants();
}

TEST_F(CacheFixture, RetainedPagesGoWhenNothingElseIsLeft) {
  const auto session = seq(8, 1);
  auto path_s = insert_prompt(session, 2);
  cache.touch(path_s[1], 3);
  EXPECT_EQ(cache.evict_device(2), 2);  // the sweeps run out within one eviction: it terminates
  EXPECT_EQ(cache.num_nodes(), 0);
  cache.check_invariants();
}

TEST_F(CacheFixture, WriteBackKeepsPrefixAfterDeviceEviction) {
  const auto tokens = seq(8, 1);
  auto path = insert_prompt(tokens, 2);
  for (int32_t node : path) cache.begin_write_back(node, host.allocate());
  EXPECT_EQ(cache.evict_device(2), 0);  // copies in flight read the device pages
  std::vector<int32_t> hits;
  for (int32_t node : path) cache.end_write_back(node);
  EXPECT_EQ(cache.evict_device(2), 2);
  EXPECT_EQ(cache.num_nodes(), 2);  // host copies remain
  auto hit = cache.match(tokens.data(), 2, hits);
  EXPECT_EQ(hit.num_device, 0);
  EXPECT_EQ(hit.num_host, 2);
  // Load the first page back: device copies stay closed under parent.
  cache.attach_device(hits[0], device.allocate());
  hit = cache.match(tokens.data(), 2, hits);
  EXPECT_EQ(hit.num_device, 1);
  EXPECT_EQ(hit.num_host, 1);
  cache.check_invariants();
  device.release(cache.node(hits[0]).device_page);  // the loading request lets go
  // Host eviction takes host-only leaves; the node with a device copy keeps its host copy
  // until its host-only child is gone.
  EXPECT_EQ(cache.evict_host(1), 1);
  EXPECT_FALSE(cache.node(path[1]).alive);
  EXPECT_EQ(cache.evict_host(1), 1);
  EXPECT_TRUE(cache.node(path[0]).alive);  // still on device
  EXPECT_EQ(cache.node(path[0]).host_page, -1);
  cache.check_invariants();
}

TEST_F(CacheFixture, ProtectedPrefixesAreTouchedAndSparedByHostEvictionOfThatEpoch) {
  // Two host-only prefixes; `a` is the older, so plain LRU takes it first.
  const auto a = seq(8, 1), b = seq(8, 100);
  for (const auto* tokens : {&a, &b}) {
    auto path = insert_prompt(*tokens, 2);
    for (int32_t node : path) cache.begin_write_back(node, host.allocate());
    for (int32_t node : path) cache.end_write_back(node);
    cache.touch(path.back());
  }
  EXPECT_EQ(cache.evict_device(4), 4);
  const int64_t evictions = cache.num_evictions();
  std::vector<int32_t> path_a, path_b;
  cache.match(a.data(), 2, path_a);
  cache.match(b.data(), 2, path_b);  // now `a` is the least recently used again
  cache.protect(path_a.back(), 7);   // protected: the most recently used, and marked
  EXPECT_EQ(cache.node(path_a[0]).protect_epoch, 7u);
  EXPECT_EQ(cache.node(path_b[0]).protect_epoch, 0u);
  // Sparing epoch 7, only `b` can go; b's leaf goes before its parent.
  EXPECT_EQ(cache.evict_host(4, 7), 2);
  EXPECT_FALSE(cache.node(path_b[0]).alive);
  EXPECT_TRUE(cache.node(path_a[1]).alive);
  EXPECT_EQ(cache.evict_host(4, 7), 0);
  // Another epoch's eviction spares nothing of it.
  EXPECT_EQ(cache.evict_host(4, 8), 2);
  EXPECT_EQ(cache.num_nodes(), 0);
  EXPECT_EQ(cache.num_evictions(), evictions + 4);
  cache.check_invariants();
}

TEST_F(CacheFixture, HostPinnedPagesAreNotEvicted) {
  const auto tokens = seq(4, 1);
  auto path = insert_prompt(tokens, 1);
  cache.begin_write_back(path[0], host.allocate());
  cache.end_write_back(path[0]);
  cache.evict_device(1);
  const int32_t host_page = cache.node(path[0]).host_page;
  host.retain(host_page);  // a load-back reads it
  EXPECT_EQ(cache.evict_host(1), 0);
  host.release(host_page);
  EXPECT_EQ(cache.evict_host(1), 1);
  EXPECT_EQ(cache.num_nodes(), 0);
  EXPECT_EQ(host.num_free(), 15);
}
