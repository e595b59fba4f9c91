#include "prefix/radix_cache.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>

namespace lightspeed::prefix {

namespace {
// Each non-root node holds at least one page, so pages bound the node count.
int32_t max_nodes(const kv::PagePool& device, const kv::PagePool& host, const kv::PagePool& disk) {
  return 1 + device.num_usable() + host.num_usable() + disk.num_usable();
}
}  // namespace

RadixCache::RadixCache(kv::PagePool& device, kv::PagePool& host, kv::PagePool& disk, int32_t page_size)
    : device_(device),
      host_(host),
      disk_(disk),
      page_size_(page_size),
      nodes_(max_nodes(device, host, disk)),
      tokens_(static_cast<size_t>(max_nodes(device, host, disk)) * page_size, 0),
      by_key_(max_nodes(device, host, disk)),
      device_lru_(max_nodes(device, host, disk)),
      host_lru_(max_nodes(device, host, disk)),
      disk_lru_(max_nodes(device, host, disk)) {
  free_ids_.reserve(nodes_.size());
  for (int32_t id = static_cast<int32_t>(nodes_.size()) - 1; id > kRoot; --id) free_ids_.push_back(id);
  nodes_[kRoot].alive = true;
  nodes_[kRoot].key = 0x5EED5EED5EED5EEDull;
  node_of_device_page_.assign(device.num_pages(), -1);
  device_.set_listener(this);
}

void RadixCache::on_shared(int32_t page) { device_lru_.remove(node_of_device_page_[page]); }

// The last other owner let go; the node becomes evictable as most recently used. A request
// releases its pages last to first, so parents land after their children.
void RadixCache::on_sole(int32_t page) { device_lru_.touch(node_of_device_page_[page]); }

bool RadixCache::tokens_equal(int32_t node, const int32_t* tokens) const {
  return std::equal(tokens, tokens + page_size_, tokens_.begin() + static_cast<ptrdiff_t>(node) * page_size_);
}

MatchResult RadixCache::match(const int32_t* tokens, int32_t max_pages, std::vector<int32_t>& path,
                              int32_t retention) {
  MatchResult result;
  path.clear();
  int32_t parent = kRoot;
  for (int32_t i = 0; i < max_pages; ++i) {
    const int32_t* page_tokens = tokens + static_cast<ptrdiff_t>(i) * page_size_;
    const int32_t id = by_key_.find(page_key(nodes_[parent].key, page_tokens, page_size_));
    if (id < 0 || nodes_[id].parent != parent || !tokens_equal(id, page_tokens)) break;
    const Node& n = nodes_[id];
    if (n.device_pending) break;  // its KV is still being loaded from host
    if (n.device_page >= 0) {
      // Copies are closed under parent on each tier: no device node follows a host-only one.
      assert(result.num_host == 0 && result.num_disk == 0);
      ++result.num_device;
    } else if (n.host_page >= 0) {
      if (n.host_pending) break;  // host-only and pending cannot happen: a write-back reads a device copy
      assert(result.num_disk == 0);
      ++result.num_host;
    } else if (n.disk_slot >= 0 && !n.disk_pending) {
      ++result.num_disk;
    } else {
      break;
    }
    path.push_back(id);
    parent = id;
  }
  if (!path.empty()) touch(path.back(), retention);
  return result;
}

int32_t RadixCache::insert(int32_t parent, const int32_t* page_tokens, int32_t device_page,
                           int32_t* cached_page) {
  const uint64_t key = page_key(nodes_[parent].key, page_tokens, page_size_);
  int32_t id = by_key_.find(key);
  if (id >= 0) {
    if (nodes_[id].parent != parent || !tokens_equal(id, page_tokens)) return -1;  // collision
    // Being loaded from host: sharing its page now would read KV that has not landed. The
    // caller's copy stays private (as on a collision).
    if (nodes_[id].device_pending) return -1;
    if (nodes_[id].device_page < 0) attach_device(id, device_page);
    *cached_page = nodes_[id].device_page;
    return id;
  }
  id = new_node(parent, key, page_tokens);
  attach_device(id, device_page);
  *cached_page = device_page;
  return id;
}

int32_t RadixCache::new_node(int32_t parent, uint64_t key, const int32_t* page_tokens) {
  assert(!free_ids_.empty());
  const int32_t id = free_ids_.back();
  free_ids_.pop_back();
  Node& n = nodes_[id];
  n = Node{};
  n.key = key;
  n.parent = parent;
  n.depth = nodes_[parent].depth + 1;
  n.alive = true;
  std::copy(page_tokens, page_tokens + page_size_, tokens_.begin() + static_cast<ptrdiff_t>(id) * page_size_);
  by_key_.insert(key, id);
  ++nodes_[parent].num_children;
  ++num_nodes_;
  return id;
}

void RadixCache::attach_device(int32_t id, int32_t device_page, bool loading) {
  Node& n = nodes_[id];
  assert(n.device_page < 0);
  n.device_pending = loading;
  assert(n.parent == kRoot || nodes_[n.parent].device_page >= 0);
  device_.retain(device_page);  // before watching: the caller's own reference is no news
  n.device_page = device_page;
  node_of_device_page_[device_page] = id;
  device_.watch(device_page, true);
  ++nodes_[n.parent].num_device_children;
  ++num_device_resident_;
  if (device_.refcount(device_page) == 1) device_lru_.touch(id);
}

void RadixCache::begin_write_back(int32_t id, int32_t host_page) {
  Node& n = nodes_[id];
  assert(n.host_page < 0 && n.device_page >= 0);
  n.host_page = host_page;
  n.host_pending = true;
  ++nodes_[n.parent].num_host_children;
  ++num_host_resident_;
  host_lru_.touch(id);
}

void RadixCache::end_write_back(int32_t id) { nodes_[id].host_pending = false; }

void RadixCache::begin_disk_write(int32_t id, int32_t slot) {
  Node& n = nodes_[id];
  assert(n.disk_slot < 0 && n.host_page >= 0 && !n.host_pending && !parent_lacks_disk(n));
  n.disk_slot = slot;
  n.disk_pending = true;
  ++nodes_[n.parent].num_disk_children;
  ++num_disk_resident_;
  disk_lru_.touch(id);
}

bool RadixCache::end_disk_write(int32_t id) {
  Node& n = nodes_[id];
  n.disk_pending = false;
  if (!parent_lacks_disk(n)) return true;
  release_disk(id);  // its host copy, the write's source, keeps the node
  return false;
}

void RadixCache::fail_disk_write(int32_t id) {
  assert(nodes_[id].disk_pending);
  nodes_[id].disk_pending = false;
  release_disk(id);
}

void RadixCache::release_disk_copy(int32_t id) {
  assert(nodes_[id].disk_slot >= 0 && !nodes_[id].disk_pending);
  release_disk(id);
}

void RadixCache::repair_disk_closure() {
  std::vector<int32_t> by_depth;
  for (int32_t id = 1; id < static_cast<int32_t>(nodes_.size()); ++id)
    if (nodes_[id].alive) by_depth.push_back(id);
  std::stable_sort(by_depth.begin(), by_depth.end(),
                   [&](int32_t a, int32_t b) { return nodes_[a].depth < nodes_[b].depth; });
  for (int32_t id : by_depth) {
    const Node& n = nodes_[id];
    // A pending write is settled when it lands (end_disk_write), not here: its slot is in use.
    if (n.disk_slot >= 0 && !n.disk_pending && parent_lacks_disk(n)) release_disk(id);
  }
  // A node left without a copy has no children with one (closure), so its subtree goes with it.
  for (auto it = by_depth.rbegin(); it != by_depth.rend(); ++it)
    if (!has_copy(nodes_[*it])) remove_node(*it);
}

std::vector<uint8_t> RadixCache::restore_disk(std::span<const DiskRecord> records) {
  if (num_nodes_ != 0) throw std::logic_error("restore_disk() needs an empty cache");
  std::vector<uint8_t> accepted(records.size(), 0);
  std::vector<int32_t> order(records.size());
  for (size_t i = 0; i < records.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return records[a].depth < records[b].depth; });
  std::vector<int32_t> node_of(records.size(), -1);
  std::vector<uint8_t> slot_taken(disk_.num_pages(), 0);
  for (int32_t i : order) {
    const DiskRecord& rec = records[i];
    if (rec.slot <= 0 || rec.slot >= disk_.num_pages() || slot_taken[rec.slot] || disk_.refcount(rec.slot) != 0)
      continue;
    const int32_t parent = rec.parent_key == nodes_[kRoot].key ? kRoot : by_key_.find(rec.parent_key);
    if (parent < 0 || (parent != kRoot && nodes_[parent].disk_slot < 0) || nodes_[parent].depth + 1 != rec.depth)
      continue;
    if (std::any_of(rec.tokens, rec.tokens + page_size_, [](int32_t t) { return t < 0; })) continue;
    if (page_key(nodes_[parent].key, rec.tokens, page_size_) != rec.key || by_key_.find(rec.key) >= 0) continue;
    slot_taken[rec.slot] = 1;
    const int32_t id = new_node(parent, rec.key, rec.tokens);
    nodes_[id].disk_slot = rec.slot;
    ++nodes_[parent].num_disk_children;
    ++num_disk_resident_;
    node_of[i] = id;
    accepted[i] = 1;
  }
  std::vector<int32_t> slots;
  for (size_t i = 0; i < records.size(); ++i)
    if (accepted[i]) slots.push_back(records[i].slot);
  disk_.claim(slots);
  // LRU order, children before their ancestors: from the newest record back, each places itself
  // after the ancestors it brings that are not placed yet (most recent first), then the list is
  // touched from its least recent end. Each node is placed once: O(records).
  std::vector<uint8_t> placed(nodes_.size(), 0);
  std::vector<int32_t> most_recent_first, chain;
  for (size_t i = records.size(); i-- > 0;) {
    chain.clear();
    for (int32_t id = node_of[i]; id > kRoot && !placed[id]; id = nodes_[id].parent) chain.push_back(id);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      placed[*it] = 1;
      most_recent_first.push_back(*it);
    }
  }
  for (auto it = most_recent_first.rbegin(); it != most_recent_first.rend(); ++it) disk_lru_.touch(*it);
  return accepted;
}

void RadixCache::touch(int32_t id, int32_t retention) {
  for (; id != kRoot; id = nodes_[id].parent) {
    Node& n = nodes_[id];
    n.device_retention = std::max(n.device_retention, retention);
    n.host_retention = std::max(n.host_retention, retention);
    n.disk_retention = std::max(n.disk_retention, retention);
    touch_lists(id);
  }
}

void RadixCache::protect(int32_t id, uint32_t epoch) {
  for (; id != kRoot; id = nodes_[id].parent) {
    nodes_[id].protect_epoch = epoch;
    touch_lists(id);
  }
}

void RadixCache::touch_lists(int32_t id) {
  if (device_lru_.contains(id)) device_lru_.touch(id);
  if (nodes_[id].host_page >= 0) host_lru_.touch(id);
  if (nodes_[id].disk_slot >= 0) disk_lru_.touch(id);
}

bool RadixCache::device_evictable(const Node& n) const {
  // A pending host copy is still being read from the device page.
  if (n.device_page < 0 || n.host_pending || n.device_pending || device_.refcount(n.device_page) != 1 ||
      n.num_device_children != 0)
    return false;
  // Dropping the only copy removes the node, which must then be a leaf.
  return (n.host_page >= 0 && !n.host_pending) || (n.disk_slot >= 0 && !n.disk_pending) || n.num_children == 0;
}

bool RadixCache::host_evictable(const Node& n) const {
  // A pending disk copy is still being written from the host page.
  if (n.host_page < 0 || n.host_pending || n.disk_pending || host_.refcount(n.host_page) != 1 ||
      n.num_host_children != 0)
    return false;
  return n.device_page >= 0 || n.disk_slot >= 0 || n.num_children == 0;
}

bool RadixCache::disk_evictable(const Node& n) const {
  // A disk copy being read is pinned by the reader's reference.
  if (n.disk_slot < 0 || n.disk_pending || disk_.refcount(n.disk_slot) != 1 || n.num_disk_children != 0)
    return false;
  return n.device_page >= 0 || n.host_page >= 0 || n.num_children == 0;
}

void RadixCache::release_device(int32_t id) {
  Node& n = nodes_[id];
  device_lru_.remove(id);
  device_.watch(n.device_page, false);
  node_of_device_page_[n.device_page] = -1;
  device_.release(n.device_page);
  n.device_page = -1;
  n.device_pending = false;
  --nodes_[n.parent].num_device_children;
  --num_device_resident_;
}

void RadixCache::release_host(int32_t id) {
  Node& n = nodes_[id];
  host_lru_.remove(id);
  host_.release(n.host_page);
  n.host_page = -1;
  --nodes_[n.parent].num_host_children;
  --num_host_resident_;
}

void RadixCache::release_disk(int32_t id) {
  Node& n = nodes_[id];
  disk_lru_.remove(id);
  disk_.release(n.disk_slot);
  n.disk_slot = -1;
  --nodes_[n.parent].num_disk_children;
  --num_disk_resident_;
}

void RadixCache::drop_device(int32_t id) {
  release_device(id);
  if (!has_copy(nodes_[id])) remove_node(id);
}

void RadixCache::drop_host(int32_t id) {
  release_host(id);
  if (!has_copy(nodes_[id])) remove_node(id);
}

void RadixCache::drop_disk(int32_t id) {
  release_disk(id);
  if (!has_copy(nodes_[id])) remove_node(id);
}

void RadixCache::remove_node(int32_t id) {
  Node& n = nodes_[id];
  assert(n.num_children == 0);
  by_key_.erase(n.key);
  --nodes_[n.parent].num_children;
  n.alive = false;
  --num_nodes_;
  free_ids_.push_back(id);
}

// Passes repeat only when a pass evicted something: an eviction can expose a parent that the
// same pass already walked past (ancestors are touched after their children, so this is rare).
// A retained node spends a sweep and goes to the MRU end, where the pass stops: the next pass
// first meets the plain nodes that evictions exposed. Sweeps are finite, so passes end.
template <class Evictable, class Drop>
int32_t RadixCache::evict_lru(LruList& lru, int32_t Node::*retention, int32_t num_pages, Evictable&& evictable,
                              Drop&& drop) {
  int32_t evicted = 0;
  for (bool progress = true; progress && evicted < num_pages;) {
    progress = false;
    int32_t first_moved = -1;  // the pass ends where the nodes it moved begin
    for (int32_t id = lru.lru(); id != lru.end() && id != first_moved && evicted < num_pages;) {
      const int32_t next = lru.next(id);
      if (evictable(nodes_[id])) {
        if (nodes_[id].*retention > 0) {
          --(nodes_[id].*retention);
          lru.touch(id);
          if (first_moved < 0) first_moved = id;
        } else {
          drop(id);
          ++evicted;
          ++num_evictions_;
        }
        progress = true;
      }
      id = next;
    }
  }
  return evicted;
}

int32_t RadixCache::evict_device(int32_t num_pages) {
  return evict_lru(device_lru_, &Node::device_retention, num_pages,
                   [&](const Node& n) { return device_evictable(n); }, [&](int32_t id) { drop_device(id); });
}

// With a disk tier, a host copy whose disk write is still queued is lost if dropped now: the other
// copies go first, and those only when nothing else is left.
int32_t RadixCache::evict_host(int32_t num_pages, uint32_t spare_epoch) {
  auto evictable = [&](const Node& n) {
    return host_evictable(n) && (spare_epoch == 0 || n.protect_epoch != spare_epoch);
  };
  int32_t evicted = 0;
  if (disk_.num_usable() > 0)
    evicted = evict_lru(host_lru_, &Node::host_retention, num_pages,
                        [&](const Node& n) { return !n.disk_queued && evictable(n); },
                        [&](int32_t id) { drop_host(id); });
  return evicted + evict_lru(host_lru_, &Node::host_retention, num_pages - evicted, evictable,
                             [&](int32_t id) { drop_host(id); });
}

int32_t RadixCache::evict_disk(int32_t num_pages) {
  return evict_lru(disk_lru_, &Node::disk_retention, num_pages, [&](const Node& n) { return disk_evictable(n); },
                   [&](int32_t id) { drop_disk(id); });
}

void RadixCache::check_invariants() const {
  auto fail = [](const std::string& what, int32_t id) {
    throw std::logic_error("radix cache invariant: " + what + " (node " + std::to_string(id) + ")");
  };
  std::vector<int32_t> children(nodes_.size(), 0), device_children(nodes_.size(), 0),
      host_children(nodes_.size(), 0), disk_children(nodes_.size(), 0);
  int32_t alive = 0;
  for (int32_t id = 1; id < static_cast<int32_t>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.alive) continue;
    ++alive;
    if (!has_copy(n)) fail("node without any copy", id);
    if (n.depth != nodes_[n.parent].depth + 1) fail("depth", id);
    if (!nodes_[n.parent].alive) fail("parent removed", id);
    if (n.device_page >= 0 && n.parent != kRoot && nodes_[n.parent].device_page < 0)
      fail("device copy under a parent without one", id);
    if (n.host_page >= 0 && n.parent != kRoot && nodes_[n.parent].host_page < 0)
      fail("host copy under a parent without one", id);
    if (n.disk_slot >= 0 && !n.disk_pending && parent_lacks_disk(n)) fail("disk copy under a parent without one", id);
    if (n.disk_pending && (n.host_page < 0 || n.host_pending)) fail("disk write without a landed host copy", id);
    if (by_key_.find(n.key) != id) fail("key map does not point at node", id);
    if (device_lru_.contains(id) != (n.device_page >= 0 && device_.refcount(n.device_page) == 1))
      fail("device LRU holds exactly the unreferenced device copies", id);
    if (n.device_page >= 0 && node_of_device_page_[n.device_page] != id) fail("page -> node map", id);
    if (host_lru_.contains(id) != (n.host_page >= 0)) fail("host LRU membership", id);
    if (disk_lru_.contains(id) != (n.disk_slot >= 0)) fail("disk LRU membership", id);
    ++children[n.parent];
    if (n.device_page >= 0) ++device_children[n.parent];
    if (n.host_page >= 0) ++host_children[n.parent];
    if (n.disk_slot >= 0) ++disk_children[n.parent];
  }
  for (int32_t id = 0; id < static_cast<int32_t>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.alive) continue;
    if (n.num_children != children[id] || n.num_device_children != device_children[id] ||
        n.num_host_children != host_children[id] || n.num_disk_children != disk_children[id])
      fail("child counters", id);
  }
  if (alive != num_nodes_ || static_cast<size_t>(alive) != by_key_.size()) fail("node count", 0);
}

}  // namespace lightspeed::prefix
