// Prefix cache: a radix tree over full KV pages with device and host residency.
//
// Design note. One node per page. A node's key chains its tokens' hash with its parent's key, so a
// single flat hash lookup finds the child; the stored tokens are compared on every hit, so a hash
// collision yields a miss, never wrong KV. A node holds one reference on each copy it has (device
// page, host page). Requests share a node's device page by taking their own reference, which is
// also the lock: a copy is evictable only when the cache holds its sole reference. Invariants:
//   - every node except the root has at least one copy;
//   - device copies are closed under parent (a device node's parent is on device too), so a match
//     is a device run followed by a host-only run; host copies are too (the scheduler writes a page
//     through only after its parent), so a device-only node never has a host-only child and stays
//     evictable once its children are;
//   - any node's parent has a copy (eviction only removes leaves).
// Eviction is LRU over two intrusive lists; touching a node also touches its ancestors after it,
// so a scan from the LRU end meets children before their parents. Retention (a session's hint):
// a touch may give the path a number of extra sweeps; an eviction scan that meets an evictable
// node with sweeps left takes one and moves it to the most recently used end instead of dropping
// it, so within one eviction every plain page goes before a retained one, and a retained page
// outlives plain LRU by that many evictions that reach it, not for ever. The device list holds only
// unreferenced nodes (the device pool tells the cache when a cached page gains or loses its other
// owners), so an eviction never walks past the prompts of running requests.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/page_pool.h"
#include "prefix/flat_map.h"
#include "prefix/lru_list.h"

namespace lightspeed::prefix {

struct Node {
  uint64_t key = 0;
  int32_t parent = -1;
  int32_t device_page = -1;   // -1: no device copy
  int32_t host_page = -1;     // -1: no host copy
  bool host_pending = false;    // host copy written by an unacknowledged device->host copy
  bool device_pending = false;  // device copy filled by an unacknowledged host->device copy
  bool host_queued = false;     // waiting in the scheduler's write-through queue
  bool alive = false;
  int32_t num_children = 0;
  int32_t num_device_children = 0;  // children with a device copy
  int32_t num_host_children = 0;    // children with a host copy
  int32_t device_retention = 0;     // eviction sweeps the device copy survives (see touch)
  int32_t host_retention = 0;       // eviction sweeps the host copy survives
};

struct MatchResult {
  int32_t num_device = 0;  // leading matched pages resident on device
  int32_t num_host = 0;    // following matched pages resident only on host
};

class RadixCache : private kv::PageListener {
 public:
  static constexpr int32_t kRoot = 0;

  RadixCache(kv::PagePool& device, kv::PagePool& host, int32_t page_size);
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;
  ~RadixCache() { device_.set_listener(nullptr); }

  int32_t page_size() const { return page_size_; }
  const Node& node(int32_t id) const { return nodes_[id]; }

  // Longest cached prefix of `tokens` in whole pages, at most max_pages. Overwrites `path` with the
  // matched node ids: first the device-resident ones, then the host-only ones. Touches the path
  // (with `retention`, see touch).
  MatchResult match(const int32_t* tokens, int32_t max_pages, std::vector<int32_t>& path, int32_t retention = 0);

  // Records one full page of KV (`page_tokens`, held in `device_page`) as a child of `parent`.
  // Returns the node, or -1 when a colliding key blocks it. *cached_page receives the device page
  // the cache now serves this content from: `device_page`, or an existing copy the caller should
  // switch to so duplicates are freed. Does not touch: after inserting a run of pages, touch the
  // last one once (touching per page would cost O(depth^2) per prompt).
  int32_t insert(int32_t parent, const int32_t* page_tokens, int32_t device_page, int32_t* cached_page);

  // A host-only node gains a device copy. `loading`: the page is the destination of a host->device
  // copy not yet acknowledged; until end_load() the node is no hit (its KV has not landed) and
  // cannot be evicted.
  void attach_device(int32_t node, int32_t device_page, bool loading = false);
  void end_load(int32_t node) { nodes_[node].device_pending = false; }
  void set_host_queued(int32_t node, bool queued) { nodes_[node].host_queued = queued; }
  // A device node gains a host copy that is valid once the device->host copy is acknowledged.
  // Adopts the caller's reference on host_page.
  void begin_write_back(int32_t node, int32_t host_page);
  void end_write_back(int32_t node);

  // Drop up to `num_pages` unreferenced copies, least recently used first; returns how many.
  int32_t evict_device(int32_t num_pages);
  int32_t evict_host(int32_t num_pages);

  // Moves the node and its ancestors to the most recently used end of their lists; with
  // retention > 0 they survive at least that many more eviction sweeps (kept: the largest given).
  void touch(int32_t node, int32_t retention = 0);

  int32_t num_nodes() const { return num_nodes_; }
  int32_t num_device_resident() const { return num_device_resident_; }
  int32_t num_host_resident() const { return num_host_resident_; }
  // Device copies no request references: an upper bound on what evict_device() can free.
  int32_t num_unreferenced_device() const { return device_lru_.size(); }

  // Calls f(page) once per device (host) page reference the cache holds.
  template <class F>
  void for_each_device_ref(F&& f) const {
    for (const Node& n : nodes_)
      if (n.alive && n.device_page >= 0) f(n.device_page);
  }
  template <class F>
  void for_each_host_ref(F&& f) const {
    for (const Node& n : nodes_)
      if (n.alive && n.host_page >= 0) f(n.host_page);
  }
  // Throws std::logic_error naming the first broken invariant. O(nodes): tests only.
  void check_invariants() const;

 private:
  void on_shared(int32_t page) override;
  void on_sole(int32_t page) override;
  bool tokens_equal(int32_t node, const int32_t* tokens) const;
  bool device_evictable(const Node& n) const;
  bool host_evictable(const Node& n) const;
  void drop_device(int32_t id);
  void drop_host(int32_t id);
  void remove_node(int32_t id);

  kv::PagePool& device_;
  kv::PagePool& host_;
  int32_t page_size_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;    // tokens_[id * page_size_ ...]: the page's tokens
  std::vector<int32_t> free_ids_;  // node ids not in use
  std::vector<int32_t> node_of_device_page_;  // cached device page -> node, else -1
  FlatKeyMap by_key_;
  LruList device_lru_;  // nodes whose device page only the cache references
  LruList host_lru_;    // nodes with a host copy
  int32_t num_nodes_ = 0;
  int32_t num_device_resident_ = 0;
  int32_t num_host_resident_ = 0;
};

}  // namespace lightspeed::prefix
