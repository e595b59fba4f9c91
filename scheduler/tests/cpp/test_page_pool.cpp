#include "kv/page_pool.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <type_traits>

using lightspeed::kv::PageList;
using lightspeed::kv::PagePool;

TEST(PagePool, NeverHandsOutThePaddingPage) {
  PagePool pool(4);
  EXPECT_EQ(pool.num_usable(), 3);
  EXPECT_EQ(pool.allocate(), 1);
  EXPECT_EQ(pool.allocate(), 2);
  EXPECT_EQ(pool.allocate(), 3);
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_EQ(pool.refcount(0), 1);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(PagePool, RejectsAPoolWithoutThePaddingPage) { EXPECT_THROW(PagePool(0), std::invalid_argument); }

TEST(PagePool, APoolOfOnlyThePaddingPageIsATierSwitchedOff) {
  PagePool pool(1);
  EXPECT_EQ(pool.num_usable(), 0);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.allocate(), -1);
}

TEST(PagePool, SharedPagesFreeOnLastRelease) {
  PagePool pool(4);
  const int32_t page = pool.allocate();
  pool.retain(page);
  EXPECT_EQ(pool.refcount(page), 2);
  EXPECT_FALSE(pool.release(page));
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_TRUE(pool.release(page));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.allocate(), page);  // LIFO: the warmest page comes back first
}

TEST(PagePool, QuarantinedPagesServeOnlyTheForward) {
  PagePool pool(3);
  const int32_t a = pool.allocate();
  const int32_t b = pool.allocate();
  pool.begin_quarantine();
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.num_free_unquarantined(), 0);
  EXPECT_EQ(pool.allocate(), -1);  // a copy destination must not reuse a copy source
  EXPECT_EQ(pool.allocate_for_forward(), a);
  pool.release(a);
  pool.end_quarantine();
  EXPECT_EQ(pool.allocate(), a);
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(PageList, IsMoveOnlyAndReleasesOnDestruction) {
  static_assert(!std::is_copy_constructible_v<PageList>);
  static_assert(!std::is_copy_assignable_v<PageList>);
  PagePool pool(8);
  {
    PageList list(pool, 4);
    list.push_owned(pool.allocate());
    list.push_owned(pool.allocate());
    EXPECT_EQ(pool.num_free(), 5);
    PageList moved = std::move(list);
    EXPECT_TRUE(list.empty());
    EXPECT_EQ(moved.size(), 2u);
    EXPECT_EQ(pool.num_free(), 5);
  }
  EXPECT_EQ(pool.num_free(), 7);
}

TEST(PageList, MoveAssignmentReleasesWhatItHeld) {
  PagePool pool(8);
  PageList a(pool, 2), b(pool, 2);
  a.push_owned(pool.allocate());
  b.push_owned(pool.allocate());
  b.push_owned(pool.allocate());
  a = std::move(b);
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(pool.num_free(), 5);
}

TEST(PageList, SharingReplaceAndTruncateKeepCounts) {
  PagePool pool(8);
  const int32_t cached = pool.allocate();  // held by "the cache"
  PageList list(pool, 4);
  list.push_shared(cached);
  EXPECT_EQ(pool.refcount(cached), 2);
  const int32_t own = pool.allocate();
  list.push_owned(own);
  const int32_t duplicate_of = pool.allocate();
  list.replace(1, duplicate_of);  // own is freed, duplicate_of now shared
  EXPECT_EQ(pool.refcount(own), 0);
  EXPECT_EQ(pool.refcount(duplicate_of), 2);
  list.truncate(1);
  EXPECT_EQ(pool.refcount(duplicate_of), 1);
  list.clear();
  EXPECT_EQ(pool.refcount(cached), 1);
  pool.release(cached);
  pool.release(duplicate_of);
  EXPECT_EQ(pool.num_free(), 7);
}
