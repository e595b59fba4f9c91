// Paged KV ownership: one pool per memory tier (device, host) and an RAII list of page references.
//
// Design note: a page is shared by reference counting. Every owner (a request state, a prefix-cache
// node) holds exactly one reference per page it uses; the page returns to the free list when the
// last reference goes. Page 0 is never handed out: the engine pads page tables with it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lightspeed::kv {

// Told when a watched page changes between one owner and several: the prefix cache watches its
// pages to keep only unreferenced ones on its eviction list.
class PageListener {
 public:
  virtual void on_shared(int32_t page) = 0;  // refcount went 1 -> 2
  virtual void on_sole(int32_t page) = 0;    // refcount went 2 -> 1
 protected:
  ~PageListener() = default;
};

class PagePool {
 public:
  explicit PagePool(int32_t num_pages);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  int32_t num_pages() const { return static_cast<int32_t>(refcounts_.size()); }
  // Pages that may ever be handed out (all but the padding page 0).
  int32_t num_usable() const { return num_pages() - 1; }
  // Pages with no owner: the free list plus the quarantine.
  int32_t num_free() const { return static_cast<int32_t>(free_.size() + quarantine_.size()); }
  int32_t num_free_unquarantined() const { return static_cast<int32_t>(free_.size()); }
  int32_t refcount(int32_t page) const { return refcounts_[page]; }

  // Takes a page off the free list with one reference for the caller; -1 when none is free.
  // Quarantined pages are never returned here (see begin_quarantine).
  int32_t allocate();
  // Like allocate(), but prefers quarantined pages: for pages only written by the forward pass.
  int32_t allocate_for_forward();
  // Takes one reference on each of `pages` (free and distinct) for the caller, at once: restoring
  // a tier's contents at start-up. O(num_pages).
  void claim(std::span<const int32_t> pages);
  void retain(int32_t page);
  // Drops one reference; returns true when the page became free.
  bool release(int32_t page);

  // While a plan is being built, a page freed by it may still be the source of one of that plan's
  // device->host copies. Such a page may be reused by the same plan's forward (copies run first)
  // but not as the destination of the same plan's host->device copies, whose order against the
  // device->host copies is not fixed. Pages freed between begin/end wait in a quarantine.
  void begin_quarantine() { quarantining_ = true; }
  void end_quarantine();

  void set_listener(PageListener* listener) { listener_ = listener; }
  void watch(int32_t page, bool on) { watched_[page] = on; }

 private:
  std::vector<int32_t> free_;        // LIFO: the most recently freed page is the warmest.
  std::vector<int32_t> quarantine_;  // freed during the current plan build
  std::vector<int32_t> refcounts_;   // refcounts_[0] stays 1 forever: the padding page
  std::vector<uint8_t> watched_;     // pages whose 1 <-> 2 refcount changes go to listener_
  PageListener* listener_ = nullptr;
  bool quarantining_ = false;
};

// A move-only list of page references: it owns one reference per entry and drops them all when
// destroyed, so a page owned through a PageList can neither leak nor be released twice.
class PageList {
 public:
  PageList() = default;
  PageList(PagePool& pool, size_t capacity) : pool_(&pool) { pages_.reserve(capacity); }
  PageList(const PageList&) = delete;
  PageList& operator=(const PageList&) = delete;
  PageList(PageList&& other) noexcept : pool_(other.pool_), pages_(std::move(other.pages_)) {
    other.pages_.clear();
  }
  PageList& operator=(PageList&& other) noexcept;
  ~PageList() { clear(); }

  // Adopts a reference the caller already holds (a fresh allocate()).
  void push_owned(int32_t page) { pages_.push_back(page); }
  // Takes a new reference on a page someone else owns (prefix sharing).
  void push_shared(int32_t page);
  // Swaps entry i for another page (dedup against the prefix cache); references follow.
  void replace(size_t i, int32_t page);
  // Releases every page beyond the first n.
  void truncate(size_t n);
  void clear() { truncate(0); }

  std::span<const int32_t> pages() const { return pages_; }
  size_t size() const { return pages_.size(); }
  bool empty() const { return pages_.empty(); }
  int32_t operator[](size_t i) const { return pages_[i]; }
  const PagePool* pool() const { return pool_; }

 private:
  PagePool* pool_ = nullptr;
  std::vector<int32_t> pages_;
};

}  // namespace lightspeed::kv
