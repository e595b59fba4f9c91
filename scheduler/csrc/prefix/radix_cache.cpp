#include "prefix/radix_cache.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <string>

namespace lightspeed::prefix {

namespace {
// Each non-root node holds at least one page, so pages bound the node count.
int32_t max_nodes(const kv::PagePool& device, const kv::PagePool& host) {
  return 1 + device.num_usable() + host.num_usable();
}
}  // namespace

RadixCache::RadixCache(kv::PagePool& device, kv::PagePool& host, int32_t page_size)
    : device_(device),
      host_(host),
      page_size_(page_size),
      nodes_(max_nodes(device, host)),
      tokens_(static_cast<size_t>(max_nodes(device, host)) * page_size, 0),
      by_key_(max_nodes(device, host)),
      device_lru_(max_nodes(device, host)),
      host_lru_(max_nodes(device, host)) {
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
      // Device copies are closed under parent: no device node follows a host-only one.
      assert(result.num_host == 0);
      ++result.num_device;
    } else if (n.host_page >= 0 && !n.host_pending) {
      ++result.num_host;
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
  assert(!free_ids_.empty());
  id = free_ids_.back();
  free_ids_.pop_back();
  Node& n = nodes_[id];
  n = Node{};
  n.key = key;
  n.parent = parent;
  n.alive = true;
  std::copy(page_tokens, page_tokens + page_size_, tokens_.begin() + static_cast<ptrdiff_t>(id) * page_size_);
  by_key_.insert(key, id);
  ++nodes_[parent].num_children;
  ++num_nodes_;
  attach_device(id, device_page);
  *cached_page = device_page;
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

void RadixCache::touch(int32_t id, int32_t retention) {
  for (; id != kRoot; id = nodes_[id].parent) {
    Node& n = nodes_[id];
    n.device_retention = std::max(n.device_retention, retention);
    n.host_retention = std::max(n.host_retention, retention);
    if (device_lru_.contains(id)) device_lru_.touch(id);
    if (nodes_[id].host_page >= 0) host_lru_.touch(id);
  }
}

bool RadixCache::device_evictable(const Node& n) const {
  // A pending host copy is still being read from the device page.
  if (n.device_page < 0 || n.host_pending || n.device_pending || device_.refcount(n.device_page) != 1 ||
      n.num_device_children != 0)
    return false;
  // Dropping the only copy removes the node, which must then be a leaf.
  return (n.host_page >= 0 && !n.host_pending) || n.num_children == 0;
}

bool RadixCache::host_evictable(const Node& n) const {
  if (n.host_page < 0 || n.host_pending || host_.refcount(n.host_page) != 1 || n.num_host_children != 0)
    return false;
  return n.device_page >= 0 || n.num_children == 0;
}

void RadixCache::drop_device(int32_t id) {
  Node& n = nodes_[id];
  device_lru_.remove(id);
  device_.watch(n.device_page, false);
  node_of_device_page_[n.device_page] = -1;
  device_.release(n.device_page);
  n.device_page = -1;
  --nodes_[n.parent].num_device_children;
  --num_device_resident_;
  if (n.host_page < 0) remove_node(id);
}

void RadixCache::drop_host(int32_t id) {
  Node& n = nodes_[id];
  host_lru_.remove(id);
  host_.release(n.host_page);
  n.host_page = -1;
  --nodes_[n.parent].num_host_children;
  --num_host_resident_;
  if (n.device_page < 0) remove_node(id);
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
int32_t RadixCache::evict_device(int32_t num_pages) {
  int32_t evicted = 0;
  for (bool progress = true; progress && evicted < num_pages;) {
    progress = false;
    int32_t first_moved = -1;  // the pass ends where the nodes it moved begin
    for (int32_t id = device_lru_.lru(); id != device_lru_.end() && id != first_moved && evicted < num_pages;) {
      const int32_t next = device_lru_.next(id);
      if (device_evictable(nodes_[id])) {
        if (nodes_[id].device_retention > 0) {
          --nodes_[id].device_retention;
          device_lru_.touch(id);
          if (first_moved < 0) first_moved = id;
        } else {
          drop_device(id);
          ++evicted;
        }
        progress = true;
      }
      id = next;
    }
  }
  return evicted;
}

int32_t RadixCache::evict_host(int32_t num_pages) {
  int32_t evicted = 0;
  for (bool progress = true; progress && evicted < num_pages;) {
    progress = false;
    int32_t first_moved = -1;  // the pass ends where the nodes it moved begin
    for (int32_t id = host_lru_.lru(); id != host_lru_.end() && id != first_moved && evicted < num_pages;) {
      const int32_t next = host_lru_.next(id);
      if (host_evictable(nodes_[id])) {
        if (nodes_[id].host_retention > 0) {
          --nodes_[id].host_retention;
          host_lru_.touch(id);
          if (first_moved < 0) first_moved = id;
        } else {
          drop_host(id);
          ++evicted;
        }
        progress = true;
      }
      id = next;
    }
  }
  return evicted;
}

void RadixCache::check_invariants() const {
  auto fail = [](const std::string& what, int32_t id) {
    throw std::logic_error("radix cache invariant: " + what + " (node " + std::to_string(id) + ")");
  };
  std::vector<int32_t> children(nodes_.size(), 0), device_children(nodes_.size(), 0),
      host_children(nodes_.size(), 0);
  int32_t alive = 0;
  for (int32_t id = 1; id < static_cast<int32_t>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.alive) continue;
    ++alive;
    if (n.device_page < 0 && n.host_page < 0) fail("node without any copy", id);
    if (!nodes_[n.parent].alive) fail("parent removed", id);
    if (n.device_page >= 0 && n.parent != kRoot && nodes_[n.parent].device_page < 0)
      fail("device copy under a parent without one", id);
    if (n.host_page >= 0 && n.parent != kRoot && nodes_[n.parent].host_page < 0)
      fail("host copy under a parent without one", id);
    if (by_key_.find(n.key) != id) fail("key map does not point at node", id);
    if (device_lru_.contains(id) != (n.device_page >= 0 && device_.refcount(n.device_page) == 1))
      fail("device LRU holds exactly the unreferenced device copies", id);
    if (n.device_page >= 0 && node_of_device_page_[n.device_page] != id) fail("page -> node map", id);
    if (host_lru_.contains(id) != (n.host_page >= 0)) fail("host LRU membership", id);
    ++children[n.parent];
    if (n.device_page >= 0) ++device_children[n.parent];
    if (n.host_page >= 0) ++host_children[n.parent];
  }
  for (int32_t id = 0; id < static_cast<int32_t>(nodes_.size()); ++id) {
    const Node& n = nodes_[id];
    if (!n.alive) continue;
    if (n.num_children != children[id] || n.num_device_children != device_children[id] ||
        n.num_host_children != host_children[id])
      fail("child counters", id);
  }
  if (alive != num_nodes_ || static_cast<size_t>(alive) != by_key_.size()) fail("node count", 0);
}

}  // namespace lightspeed::prefix
