// The disk tier: write-through from host, hits read back through host staging pages, failed reads
// and writes, restore at start-up, and host eviction that prefers pages already on disk.
#include <gtest/gtest.h>

#include <vector>

#include "prefix/radix_cache.h"
#include "test_util.h"

using namespace lightspeed;
using namespace lightspeed::testing;

namespace {

constexpr uint64_t kRootKey = 0x5EED5EED5EED5EEDull;

// 8 usable device pages of 4 tokens, 4 host pages, 63 disk slots.
SchedulerConfig disk_config(bool async_copies = false) {
  auto config = small_config(4, 9, 5);
  config.num_disk_pages = 64;
  config.async_copies = async_copies;
  return config;
}

// What a disk write asked the engine to store.
struct Record {
  int32_t slot;
  uint64_t key, parent_key;
  int32_t depth;
  std::vector<int32_t> tokens;
};

struct Driver {
  Scheduler& s;
  std::vector<Record> written;
  std::vector<int64_t> unacked_copies, unacked_disk;

  Plan& plan() {
    Plan& p = s.next_plan();
    const int32_t ps = s.config().page_size;
    for (size_t i = 0; i < p.disk_write.size() / 2; ++i)
      written.push_back({p.disk_write[2 * i + 1], p.disk_write_keys[3 * i], p.disk_write_keys[3 * i + 1],
                         static_cast<int32_t>(p.disk_write_keys[3 * i + 2]),
                         std::vector<int32_t>(p.disk_write_tokens.begin() + i * ps,
                                              p.disk_write_tokens.begin() + (i + 1) * ps)});
    if (s.config().async_copies && p.has_copies) unacked_copies.push_back(p.step_id);
    if (s.config().async_copies && p.has_disk_ops) unacked_disk.push_back(p.step_id);
    return p;
  }
  void advance(Plan& p) {
    std::vector<int32_t> sampled(p.num_samples, 7);
    s.advance(p, sampled);
    s.check_invariants();
  }
  void ack_all() {
    for (int64_t step : unacked_copies) s.copies_done(step);
    for (int64_t step : unacked_disk) s.disk_done(step);
    unacked_copies.clear();
    unacked_disk.clear();
    s.check_invariants();
  }
  void step() {
    Plan& p = plan();
    advance(p);
    ack_all();
  }
  // Until every request finished and every copy and disk write landed.
  void drain() {
    for (int i = 0; s.has_unfinished() || s.has_pending_copies(); ++i) {
      ASSERT_LT(i, 500) << "never drained";
      step();
    }
  }
};

// Runs A, then enough other prompts to push A's pages off device and host (not disk).
int64_t evict_to_disk(Scheduler& s, Driver& d, const std::vector<int32_t>& prompt_a) {
  s.submit(make_spec("a", prompt_a, 2));
  d.drain();
  for (int k = 0; k < 3; ++k) {
    s.submit(make_spec("flood" + std::to_string(k), iota_tokens(17, 1000 + 100 * k), 2));
    d.drain();
  }
  EXPECT_EQ(s.stats().cached_disk_pages, 16);  // 4 prompts x 4 full pages
  return s.submit(make_spec("a-again", prompt_a, 2));
}

}  // namespace

TEST(DiskTier, ConfigNeedsAHostTier) {
  auto config = disk_config();
  config.num_host_pages = 0;
  EXPECT_THROW(Scheduler{config}, std::invalid_argument);
  config = disk_config();
  config.num_disk_pages = 1;
  EXPECT_THROW(Scheduler{config}, std::invalid_argument);
}

TEST(DiskTier, HostPagesAreWrittenThroughParentsFirst) {
  Scheduler s(disk_config());
  Driver d{s};
  const auto prompt = iota_tokens(17);
  s.submit(make_spec("a", prompt, 2));
  d.drain();
  ASSERT_EQ(d.written.size(), 4u);
  uint64_t parent = kRootKey;
  for (int32_t i = 0; i < 4; ++i) {
    const Record& r = d.written[i];
    EXPECT_EQ(r.parent_key, parent) << i;
    EXPECT_EQ(r.depth, i + 1);
    EXPECT_EQ(r.tokens, std::vector<int32_t>(prompt.begin() + 4 * i, prompt.begin() + 4 * i + 4));
    parent = r.key;
  }
  EXPECT_EQ(s.stats().cached_disk_pages, 4);
  EXPECT_EQ(s.stats().disk_pages_written, 4);
  EXPECT_FALSE(s.has_pending_copies());
}

TEST(DiskTier, EvictedPrefixIsReadThroughHostAndLoaded) {
  Scheduler s(disk_config());
  Driver d{s};
  const auto prompt = iota_tokens(17);
  const int64_t again = evict_to_disk(s, d, prompt);
  Plan& first = d.plan();
  ASSERT_EQ(first.disk_read.size() / 2, 4u) << "the whole prefix comes from disk";
  EXPECT_EQ(std::string(s.request_stats(again).state), "reading_disk");
  std::vector<int32_t> staging;
  for (size_t i = 0; i < 4; ++i) {
    staging.push_back(first.disk_read[2 * i + 1]);
    EXPECT_EQ(first.disk_read_keys[i], d.written[i].key);  // A's records, in prefix order
    EXPECT_EQ(first.disk_read[2 * i], d.written[i].slot);
  }
  EXPECT_EQ(row_of(first, again), -1) << "no row before its KV is on the device";
  d.advance(first);
  EXPECT_EQ(std::string(s.request_stats(again).state), "disk_landed");
  Plan& second = d.plan();
  ASSERT_EQ(second.load_back.size() / 2, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.load_back[2 * i], staging[i]) << "loads what was read";
  EXPECT_EQ(std::string(s.request_stats(again).state), "loading_prefix");
  d.advance(second);
  const auto stats = s.request_stats(again);
  EXPECT_EQ(stats.num_cached_tokens, 16);
  EXPECT_EQ(stats.num_cached_disk_tokens, 16);
  EXPECT_EQ(stats.num_cached_device_tokens + stats.num_cached_host_tokens, 0);
  Plan& third = d.plan();
  const int32_t row = row_of(third, again);
  ASSERT_GE(row, 0);
  EXPECT_EQ(third.cached_lens[row], 16) << "only the last prompt token is computed";
  d.advance(third);
  d.drain();
  EXPECT_EQ(s.stats().disk_hit_tokens, 16);
  EXPECT_EQ(s.stats().disk_pages_read, 4);
}

TEST(DiskTier, FailedReadCutsThePrefixAndDropsTheRecordsBelow) {
  Scheduler s(disk_config(/*async_copies=*/true));
  Driver d{s};
  const int64_t again = evict_to_disk(s, d, iota_tokens(17));
  Plan& first = d.plan();
  ASSERT_EQ(first.disk_read.size() / 2, 4u);
  d.advance(first);
  for (int64_t step : d.unacked_copies) s.copies_done(step);
  d.unacked_copies.clear();
  const std::vector<int32_t> bad_page = {1};  // page 2 of 4 did not verify
  s.disk_done(first.step_id, {}, bad_page);
  d.unacked_disk.clear();
  s.check_invariants();
  EXPECT_EQ(s.request_stats(again).num_cached_tokens, 4);
  EXPECT_EQ(s.request_stats(again).num_cached_disk_tokens, 4);
  EXPECT_EQ(s.stats().disk_read_failures, 1);
  EXPECT_EQ(s.stats().disk_hit_tokens, 4);
  // The bad record and the two below it (closure) are gone: 16 - 3 disk copies remain.
  EXPECT_EQ(s.stats().cached_disk_pages, 13);
  Plan& second = d.plan();
  EXPECT_EQ(second.load_back.size() / 2, 1u);
  d.advance(second);
  d.ack_all();
  d.drain();
  EXPECT_THROW(s.disk_done(first.step_id), std::invalid_argument);  // acknowledged already
}

TEST(DiskTier, FailedWritesDropTheCopyAndStoppedWritesAreNotPlanned) {
  Scheduler s(disk_config(/*async_copies=*/true));
  Driver d{s};
  s.submit(make_spec("a", iota_tokens(17), 2));
  int failed = 0;
  for (int i = 0; i < 200 && (s.has_unfinished() || s.has_pending_copies()); ++i) {
    Plan& p = d.plan();
    d.advance(p);
    for (int64_t step : d.unacked_copies) s.copies_done(step);
    d.unacked_copies.clear();
    if (p.has_disk_ops) {
      std::vector<int32_t> rows(p.disk_write.size() / 2);
      for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int32_t>(r);
      failed += static_cast<int32_t>(rows.size());
      s.disk_done(p.step_id, rows, {});  // "no space left on device"
      s.stop_disk_writes();
    }
    d.unacked_disk.clear();
    s.check_invariants();
  }
  EXPECT_GE(failed, 1);
  EXPECT_EQ(s.stats().disk_write_failures, failed);
  EXPECT_EQ(s.stats().cached_disk_pages, 0);
  EXPECT_TRUE(s.stats().disk_writes_stopped);
  const size_t planned = d.written.size();
  s.submit(make_spec("b", iota_tokens(17, 500), 3));
  d.drain();
  EXPECT_EQ(d.written.size(), planned) << "no write after stop_disk_writes()";
  EXPECT_GT(s.stats().cached_host_pages, 0) << "the host tier goes on";
}

TEST(DiskTier, RestoreRebuildsTheTreeAndRejectsBadRecords) {
  Scheduler before_restart(disk_config());
  Driver first_life{before_restart};
  const auto prompt = iota_tokens(17);
  first_life.s.submit(make_spec("a", prompt, 2));
  first_life.drain();
  std::vector<Record> records = first_life.written;
  ASSERT_EQ(records.size(), 4u);
  auto orphan = records[3];
  orphan.parent_key = 12345;  // its parent is not on disk
  orphan.slot = 40;
  auto forged = records[1];
  forged.tokens[0] += 1;  // tokens that do not hash to its key
  forged.slot = 41;
  auto twice = records[2];  // a slot claimed twice
  auto outside = records[0];
  outside.slot = 64;
  for (const Record& r : {orphan, forged, twice, outside}) records.push_back(r);
  std::vector<prefix::DiskRecord> view;
  for (const Record& r : records) view.push_back({r.slot, r.key, r.parent_key, r.depth, r.tokens.data()});

  Scheduler s(disk_config());
  const auto accepted = s.restore_disk_pages(view);
  EXPECT_EQ(accepted, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0}));
  s.check_invariants();
  EXPECT_EQ(s.stats().cached_disk_pages, 4);
  EXPECT_EQ(s.stats().free_disk_pages, 63 - 4);
  const int64_t again = s.submit(make_spec("a", prompt, 2));
  Driver d{s};
  Plan& p = d.plan();
  ASSERT_EQ(p.disk_read.size() / 2, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(p.disk_read[2 * i], records[i].slot);
  d.advance(p);
  d.drain();
  EXPECT_EQ(s.request_stats(again).num_cached_disk_tokens, 16);
  EXPECT_THROW(s.restore_disk_pages(view), std::invalid_argument) << "only before the first plan";
}

TEST(DiskTier, AbortWhileReadingHoldsPagesUntilTheReadsLand) {
  Scheduler s(disk_config(/*async_copies=*/true));
  Driver d{s};
  const int64_t again = evict_to_disk(s, d, iota_tokens(17));
  Plan& p = d.plan();
  ASSERT_EQ(p.disk_read.size() / 2, 4u);
  const int32_t free_host = s.stats().free_host_pages;
  s.abort(again);
  s.check_invariants();
  EXPECT_EQ(s.stats().free_host_pages, free_host) << "the staging pages are still being written";
  d.advance(p);
  d.ack_all();
  EXPECT_GT(s.stats().free_host_pages, free_host);
  d.drain();
}

TEST(DiskTier, HostEvictionPrefersCopiesAlreadyOnDisk) {
  kv::PagePool device(8), host(3), disk(8);
  prefix::RadixCache cache(device, host, disk, 4);
  std::vector<int32_t> nodes;
  for (int32_t first : {10, 20}) {  // two one-page prompts, X then Y
    const auto tokens = iota_tokens(4, first);
    const int32_t page = device.allocate();
    int32_t cached = -1;
    nodes.push_back(cache.insert(prefix::RadixCache::kRoot, tokens.data(), page, &cached));
    device.release(page);
    cache.begin_write_back(nodes.back(), host.allocate());
    cache.end_write_back(nodes.back());
  }
  cache.begin_disk_write(nodes[1], disk.allocate());  // Y reaches disk, X's write is still queued
  ASSERT_TRUE(cache.end_disk_write(nodes[1]));
  cache.set_disk_queued(nodes[0], true);
  cache.touch(nodes[1]);  // X is the least recently used
  EXPECT_EQ(cache.evict_host(1), 1);
  EXPECT_GE(cache.node(nodes[0]).host_page, 0) << "X would be lost: Y goes first";
  EXPECT_LT(cache.node(nodes[1]).host_page, 0);
  EXPECT_EQ(cache.evict_host(1), 1) << "and X when nothing else is left";
  cache.check_invariants();
}

TEST(DiskTier, FailedParentWriteDropsTheChildCopyThatLanded) {
  kv::PagePool device(8), host(8), disk(8);
  prefix::RadixCache cache(device, host, disk, 4);
  const auto tokens = iota_tokens(8);
  std::vector<int32_t> path;
  for (int32_t i = 0, parent = prefix::RadixCache::kRoot; i < 2; ++i) {
    const int32_t page = device.allocate();
    int32_t cached = -1;
    parent = cache.insert(parent, tokens.data() + 4 * i, page, &cached);
    device.release(page);
    cache.begin_write_back(parent, host.allocate());
    cache.end_write_back(parent);
    path.push_back(parent);
  }
  cache.begin_disk_write(path[0], disk.allocate());
  cache.begin_disk_write(path[1], disk.allocate());  // in flight beside its parent's
  ASSERT_TRUE(cache.end_disk_write(path[1]));       // the child lands first
  cache.fail_disk_write(path[0]);                    // the parent's write fails
  cache.repair_disk_closure();
  cache.check_invariants();
  EXPECT_LT(cache.node(path[1]).disk_slot, 0);
  EXPECT_EQ(cache.num_disk_resident(), 0);
  EXPECT_EQ(disk.num_free(), 7);
}
