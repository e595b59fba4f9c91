#include "kv/page_pool.h"

#include <cassert>
#include <stdexcept>
#include <string>
#include <vector>

namespace lightspeed::kv {

PagePool::PagePool(int32_t num_pages) {
  // One page is a tier that is switched off: only the padding page, nothing to hand out.
  if (num_pages < 1) throw std::invalid_argument("a page pool needs page 0 (padding), got no pages");
  refcounts_.assign(num_pages, 0);
  refcounts_[0] = 1;
  watched_.assign(num_pages, 0);
  free_.reserve(num_pages);
  quarantine_.reserve(num_pages);
  // Pushed in reverse so that allocation hands out 1, 2, 3, ... on a fresh pool.
  for (int32_t page = num_pages - 1; page >= 1; --page) free_.push_back(page);
}

int32_t PagePool::allocate() {
  if (free_.empty()) return -1;
  const int32_t page = free_.back();
  free_.pop_back();
  assert(refcounts_[page] == 0);
  refcounts_[page] = 1;
  return page;
}

int32_t PagePool::allocate_for_forward() {
  if (quarantine_.empty()) return allocate();
  const int32_t page = quarantine_.back();
  quarantine_.pop_back();
  assert(refcounts_[page] == 0);
  refcounts_[page] = 1;
  return page;
}

void PagePool::claim(std::span<const int32_t> pages) {
  for (int32_t page : pages) {
    if (page <= 0 || page >= num_pages() || refcounts_[page] != 0)
      throw std::invalid_argument("claim(): page " + std::to_string(page) + " is not a free page");
    refcounts_[page] = 1;
  }
  std::erase_if(free_, [&](int32_t page) { return refcounts_[page] != 0; });
  std::erase_if(quarantine_, [&](int32_t page) { return refcounts_[page] != 0; });
}

void PagePool::retain(int32_t page) {
  assert(page > 0 && refcounts_[page] > 0);
  if (++refcounts_[page] == 2 && watched_[page]) listener_->on_shared(page);
}

bool PagePool::release(int32_t page) {
  assert(page > 0 && refcounts_[page] > 0);
  if (--refcounts_[page] != 0) {
    if (refcounts_[page] == 1 && watched_[page]) listener_->on_sole(page);
    return false;
  }
  (quarantining_ ? quarantine_ : free_).push_back(page);
  return true;
}

void PagePool::end_quarantine() {
  quarantining_ = false;
  for (int32_t page : quarantine_) free_.push_back(page);
  quarantine_.clear();
}

PageList& PageList::operator=(PageList&& other) noexcept {
  if (this != &other) {
    clear();
    pool_ = other.pool_;
    pages_ = std::move(other.pages_);
    other.pages_.clear();
  }
  return *this;
}

void PageList::push_shared(int32_t page) {
  pool_->retain(page);
  pages_.push_back(page);
}

void PageList::replace(size_t i, int32_t page) {
  pool_->retain(page);
  pool_->release(pages_[i]);
  pages_[i] = page;
}

void PageList::truncate(size_t n) {
  while (pages_.size() > n) {
    pool_->release(pages_.back());
    pages_.pop_back();
  }
}

}  // namespace lightspeed::kv
