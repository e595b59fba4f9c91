// Prefix cache: a radix tree over full KV pages with device, host and disk residency.
//
// Design note. One node per page. A node's key chains its tokens' hash with its parent's key, so a
// single flat hash lookup finds the child; the stored tokens are compared on every hit, so a hash
// collision yields a miss, never wrong KV. A node holds one reference on each copy it has (device
// page, host page, disk slot). Requests share a node's device page by taking their own reference,
// which is also the lock: a copy is evictable only when the cache holds its sole reference.
// Invariants:
//   - every node except the root has at least one copy;
//   - each tier's copies are closed under parent (a device node's parent is on device too, and
//     likewise on host and on disk), so a match is a device run, then a host-only run, then a
//     disk-only run. The scheduler keeps this: it writes a page through to host only after its
//     parent, and to disk only after its parent (a disk copy may land before its parent's, which
//     is still being written); a node with a child on a tier is not evicted from that tier. Hence
//     a node without a child on a tier stays evictable there once it has a copy elsewhere, and no
//     tier can pin another. A failed disk write or read drops disk copies below it to keep this;
//   - any node's parent has a copy (eviction only removes leaves).
// Eviction is LRU over one intrusive list per tier; touching a node also touches its ancestors
// after it, so a scan from the LRU end meets children before their parents. Retention (a session's
// hint): a touch may give the path a number of extra sweeps; an eviction scan that meets an
// evictable node with sweeps left takes one and moves it to the most recently used end instead of
// dropping it, so within one eviction every plain page goes before a retained one, and a retained
// page outlives plain LRU by that many evictions that reach it, not for ever. The device list holds
// only unreferenced nodes (the device pool tells the cache when a cached page gains or loses its
// other owners), so an eviction never walks past the prompts of running requests. With a disk tier,
// host eviction prefers copies whose disk write is not still queued: those are the ones that would
// be lost.
#pragma once

#include <cstdint>
#include <span>
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
  int32_t disk_slot = -1;     // -1: no disk copy
  int32_t depth = 0;          // pages from the root: a child of the root has depth 1
  bool host_pending = false;    // host copy filled by an unacknowledged device->host copy
  bool device_pending = false;  // device copy filled by an unacknowledged host->device copy
  bool disk_pending = false;    // disk copy written by an unacknowledged host->disk write (its host
                                // copy, the source, is pinned meanwhile)
  bool host_queued = false;     // waiting in the scheduler's write-through queue
  bool disk_queued = false;     // waiting in the scheduler's disk write queue
  bool alive = false;
  int32_t num_children = 0;
  int32_t num_device_children = 0;  // children with a device copy
  int32_t num_host_children = 0;    // children with a host copy
  int32_t num_disk_children = 0;    // children with a disk copy
  int32_t device_retention = 0;     // eviction sweeps the device copy survives (see touch)
  int32_t host_retention = 0;       // eviction sweeps the host copy survives
  int32_t disk_retention = 0;       // eviction sweeps the disk copy survives
  uint32_t protect_epoch = 0;       // last protect() that reached it (see evict_host)
};

struct MatchResult {
  int32_t num_device = 0;  // leading matched pages resident on device
  int32_t num_host = 0;    // following matched pages resident only on host
  int32_t num_disk = 0;    // following matched pages resident only on disk
};

// One disk record found at start-up (see RadixCache::restore_disk).
struct DiskRecord {
  int32_t slot;
  uint64_t key;
  uint64_t parent_key;
  int32_t depth;
  const int32_t* tokens;  // page_size tokens
};

class RadixCache : private kv::PageListener {
 public:
  static constexpr int32_t kRoot = 0;

  RadixCache(kv::PagePool& device, kv::PagePool& host, kv::PagePool& disk, int32_t page_size);
  // No disk tier.
  RadixCache(kv::PagePool& device, kv::PagePool& host, int32_t page_size) : RadixCache(device, host, no_disk_, page_size) {}
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;
  ~RadixCache() { device_.set_listener(nullptr); }

  int32_t page_size() const { return page_size_; }
  const Node& node(int32_t id) const { return nodes_[id]; }

  // Longest cached prefix of `tokens` in whole pages, at most max_pages. Overwrites `path` with the
  // matched node ids: first the device-resident ones, then the host-only, then the disk-only ones.
  // Touches the path (with `retention`, see touch).
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
  // A node with a landed host copy gains a disk copy in `slot`, valid once the host->disk write is
  // acknowledged; the host copy is not evictable meanwhile. Adopts the caller's reference on slot.
  void begin_disk_write(int32_t node, int32_t slot);
  // The write landed. Returns false when the copy was dropped instead: its parent lost its own
  // disk copy meanwhile (a failure), so the closure repair must run (repair_disk_closure()).
  bool end_disk_write(int32_t node);
  // The write did not happen: its disk copy goes. Run repair_disk_closure() afterwards.
  void fail_disk_write(int32_t node);
  // A read of the node's disk copy failed its checks: the copy goes. Run repair_disk_closure() after.
  void release_disk_copy(int32_t node);
  // After disk copies were dropped for failures: drops every landed disk copy whose parent has none
  // (such a prefix cannot come back from disk), then removes nodes left without a copy, leaves
  // first. O(nodes log nodes): failures are rare.
  void repair_disk_closure();
  void set_disk_queued(int32_t node, bool queued) { nodes_[node].disk_queued = queued; }
  const int32_t* tokens(int32_t node) const { return tokens_.data() + static_cast<ptrdiff_t>(node) * page_size_; }
  // Start-up, on an empty cache: disk records become disk-only nodes, parents first. A record is
  // rejected when its parent is not cached, its key does not chain from its parent's key and its
  // tokens, its key is cached already, or its slot is not free. Records are given oldest first:
  // that is their LRU order. Adopts a reference on each accepted slot; returns accepted[i].
  std::vector<uint8_t> restore_disk(std::span<const DiskRecord> records);
  // Drop up to `num_pages` unreferenced copies, least recently used first; returns how many.
  // evict_host spares the nodes that protect(·, spare_epoch) reached, when spare_epoch is not 0.
  int32_t evict_device(int32_t num_pages);
  int32_t evict_host(int32_t num_pages, uint32_t spare_epoch = 0);
  int32_t evict_disk(int32_t num_pages);

  // Moves the node and its ancestors to the most recently used end of their lists; with
  // retention > 0 they survive at least that many more eviction sweeps (kept: the largest given).
  void touch(int32_t node, int32_t retention = 0);
  // touch(node), and marks the node and its ancestors with `epoch` (> 0) for evict_host to spare.
  void protect(int32_t node, uint32_t epoch);

  int32_t num_nodes() const { return num_nodes_; }
  int32_t num_device_resident() const { return num_device_resident_; }
  int32_t num_host_resident() const { return num_host_resident_; }
  int32_t num_disk_resident() const { return num_disk_resident_; }
  // Copies dropped by evict_* since construction, all tiers: a rising count means the cache is full.
  int64_t num_evictions() const { return num_evictions_; }
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
  template <class F>
  void for_each_disk_ref(F&& f) const {
    for (const Node& n : nodes_)
      if (n.alive && n.disk_slot >= 0) f(n.disk_slot);
  }
  // Throws std::logic_error naming the first broken invariant. O(nodes): tests only.
  void check_invariants() const;

 private:
  void on_shared(int32_t page) override;
  void on_sole(int32_t page) override;
  bool tokens_equal(int32_t node, const int32_t* tokens) const;
  void touch_lists(int32_t id);  // to the most recently used end of each list it is on
  bool device_evictable(const Node& n) const;
  bool host_evictable(const Node& n) const;
  bool disk_evictable(const Node& n) const;
  bool has_copy(const Node& n) const { return n.device_page >= 0 || n.host_page >= 0 || n.disk_slot >= 0; }
  template <class Evictable, class Drop>
  int32_t evict_lru(LruList& lru, int32_t Node::*retention, int32_t num_pages, Evictable&& evictable, Drop&& drop);
  bool parent_lacks_disk(const Node& n) const { return n.parent != kRoot && nodes_[n.parent].disk_slot < 0; }
  // release_*: drop one copy; drop_*: and remove the node when it was the last.
  void release_device(int32_t id);
  void release_host(int32_t id);
  void release_disk(int32_t id);
  void drop_device(int32_t id);
  void drop_host(int32_t id);
  void drop_disk(int32_t id);
  void remove_node(int32_t id);
  int32_t new_node(int32_t parent, uint64_t key, const int32_t* page_tokens);

  kv::PagePool no_disk_{1};  // the disk "tier" of a cache without one: only the padding slot
  kv::PagePool& device_;
  kv::PagePool& host_;
  kv::PagePool& disk_;
  int32_t page_size_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;    // tokens_[id * page_size_ ...]: the page's tokens
  std::vector<int32_t> free_ids_;  // node ids not in use
  std::vector<int32_t> node_of_device_page_;  // cached device page -> node, else -1
  FlatKeyMap by_key_;
  LruList device_lru_;  // nodes whose device page only the cache references
  LruList host_lru_;    // nodes with a host copy
  LruList disk_lru_;    // nodes with a disk copy
  int32_t num_nodes_ = 0;
  int32_t num_device_resident_ = 0;
  int32_t num_host_resident_ = 0;
  int32_t num_disk_resident_ = 0;
  int64_t num_evictions_ = 0;
};

}  // namespace lightspeed::prefix
