// The disk tier: host pages written to disk in the background, disk hits read back through host.
//
// Design note. A page reaches disk the way it reaches host: written through once its host copy has
// landed (queued in that order, so parents before children), at most max_disk_write_pages in
// flight, so that a page evicted from host is usually on disk already and host eviction never waits
// for the disk. The host copy is pinned while it is being written. A disk hit is read into host
// pages the request owns (staging), checked by the engine (checksum, key and tokens of the record),
// then copied to device pages the request owns: the disk part of a prefix joins the cache's device
// tier like freshly computed pages, when the request inserts them after its first chunk. Reads thus
// never touch the host tier's closure, and nothing the request later does depends on the cache
// nodes it read from (a failure elsewhere may drop them meanwhile). A read that fails its checks
// cuts the request's prefix there (the rest is recomputed) and drops the bad record and the disk
// copies below it.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "fsm/transitions.h"
#include "scheduler.h"

namespace lightspeed {

void Scheduler::queue_disk_write(int32_t node) {
  const prefix::Node& n = cache_.node(node);
  if (disk_queue_.empty() || disk_writes_stopped_ || n.disk_slot >= 0 || n.disk_queued || n.host_page < 0 ||
      n.host_pending)
    return;
  if (disk_queue_size_ == disk_queue_.size()) return;  // full: this page stays off disk
  disk_queue_[(disk_queue_head_ + disk_queue_size_) % disk_queue_.size()] = {node, n.key};
  ++disk_queue_size_;
  cache_.set_disk_queued(node, true);
}

void Scheduler::emit_disk_writes(Plan& plan) {
  // Entries sent back behind their parent are looked at once per plan.
  for (size_t budget = disk_queue_size_;
       budget > 0 && disk_queue_size_ > 0 && disk_write_in_flight_ < config_.max_disk_write_pages; --budget) {
    const WriteThroughEntry entry = disk_queue_[disk_queue_head_];
    disk_queue_head_ = (disk_queue_head_ + 1) % disk_queue_.size();
    --disk_queue_size_;
    const prefix::Node& n = cache_.node(entry.node);
    if (!n.alive || n.key != entry.key || !n.disk_queued) continue;  // removed (and maybe reused)
    cache_.set_disk_queued(entry.node, false);
    if (disk_writes_stopped_ || n.disk_slot >= 0 || n.host_page < 0 || n.host_pending) continue;
    const auto parent_ready = [&] { return n.parent == prefix::RadixCache::kRoot || cache_.node(n.parent).disk_slot >= 0; };
    if (!parent_ready()) {
      // Disk copies stay closed under parent: wait for the parent's write, unless none is coming.
      if (cache_.node(n.parent).disk_queued) queue_disk_write(entry.node);
      continue;
    }
    int32_t slot = disk_.allocate();
    if (slot < 0 && cache_.evict_disk(1) > 0) slot = disk_.allocate();
    if (slot < 0) continue;  // every slot is being read or backs a prefix below it
    if (!parent_ready()) {   // the eviction took the parent's copy
      disk_.release(slot);
      continue;
    }
    cache_.begin_disk_write(entry.node, slot);
    const uint64_t parent_key = cache_.node(n.parent).key;
    plan.disk_write.insert(plan.disk_write.end(), {n.host_page, slot});
    plan.disk_write_keys.insert(plan.disk_write_keys.end(), {n.key, parent_key, static_cast<uint64_t>(n.depth)});
    const int32_t* tokens = cache_.tokens(entry.node);
    plan.disk_write_tokens.insert(plan.disk_write_tokens.end(), tokens, tokens + page_size_);
    building_.disk_write_nodes.push_back(entry.node);
    ++disk_write_in_flight_;
  }
}

// Staging host pages for the disk part of a match: as many as host memory gives, up to num_disk.
int32_t Scheduler::reserve_disk_reads(int32_t num_disk, kv::PageList& host_pins) {
  int32_t reserved = 0;
  for (; reserved < num_disk; ++reserved) {
    int32_t page = host_.allocate();
    if (page < 0 && cache_.evict_host(num_disk - reserved) > 0) page = host_.allocate();
    if (page < 0) break;
    host_pins.push_owned(page);
  }
  return reserved;
}

// The request reads the disk part of its match into the staging pages at the end of host_pins
// (its host part, if any, is being loaded by this plan already).
void Scheduler::read_from_disk(Plan& plan, int32_t record, prefix::MatchResult match, kv::PageList device_pages,
                               kv::PageList host_pins, int32_t cached_tokens) {
  Request& r = records_[record];
  kv::PageList disk_pins(disk_, match.num_disk);
  const int32_t first = match.num_device + match.num_host;
  for (int32_t k = 0; k < match.num_disk; ++k) {
    const int32_t node = match_path_[first + k];
    const int32_t slot = cache_.node(node).disk_slot;
    disk_pins.push_shared(slot);
    building_.disk_read_slots.push_back(slot);
    plan.disk_read.insert(plan.disk_read.end(), {slot, host_pins[match.num_host + k]});
    plan.disk_read_keys.push_back(cache_.node(node).key);
    plan.disk_read_tokens.insert(plan.disk_read_tokens.end(), cache_.tokens(node), cache_.tokens(node) + page_size_);
  }
  building_.disk_read_nodes.insert(building_.disk_read_nodes.end(), match_path_.begin() + first,
                                   match_path_.begin() + first + match.num_disk);
  const auto first_row = static_cast<int32_t>(plan.disk_read_keys.size()) - match.num_disk;
  r.state = fsm::admit_reading_disk(std::get<fsm::Waiting>(std::move(r.state)), std::move(device_pages),
                                    std::move(host_pins), std::move(disk_pins), cached_tokens, match.num_disk,
                                    first_row);
  loading_.push_back(record);
  building_.waiters.push_back(r.req_id);
  r.copy_step = plan.step_id;
}

// Requests whose disk reads landed copy the pages read to the device, in the order they came.
void Scheduler::load_landed(Plan& plan) {
  for (size_t i = 0; i < loading_.size();) {
    const int32_t record = loading_[i];
    Request& r = records_[record];
    auto* landed = std::get_if<fsm::DiskLanded>(&r.state);
    if (landed == nullptr) {
      ++i;
      continue;
    }
    const int32_t count = landed->num_disk_pages;
    if (!ensure_device_free(count, true)) break;  // copy targets: not from pages this plan freed
    if (count == 0) {
      r.state = fsm::nothing_to_load(std::move(*landed));
      loading_.erase(loading_.begin() + static_cast<ptrdiff_t>(i));
      insert_sorted(running_, record);
      continue;
    }
    const size_t first = landed->host_pages.size() - static_cast<size_t>(count);
    for (int32_t k = 0; k < count; ++k) {
      const int32_t page = device_.allocate();
      landed->device_pages.push_owned(page);
      plan.load_back.insert(plan.load_back.end(), {landed->host_pages[first + k], page});
    }
    r.state = fsm::load_landed(std::move(*landed));
    building_.waiters.push_back(r.req_id);
    r.copy_step = plan.step_id;
    ++i;
  }
}

// A batch's disk ops are all done (those reported failed did not happen or did not verify).
void Scheduler::settle_disk_ops(CopyBatch& batch) {
  bool repair = false;
  std::vector<uint8_t> failed(batch.disk_write_nodes.size(), 0);
  for (int32_t row : batch.failed_writes) failed[row] = 1;
  for (size_t i = 0; i < batch.disk_write_nodes.size(); ++i) {
    // A node being written keeps its host copy (pinned), so it is still the one written.
    const int32_t node = batch.disk_write_nodes[i];
    if (failed[i]) {
      cache_.fail_disk_write(node);
      ++disk_write_failures_;
      repair = true;
    } else {
      repair |= !cache_.end_disk_write(node);
      ++disk_pages_written_;
    }
  }
  disk_write_in_flight_ -= static_cast<int32_t>(batch.disk_write_nodes.size());
  batch.read_failed.assign(batch.disk_read_nodes.size(), 0);
  for (int32_t row : batch.failed_reads) batch.read_failed[row] = 1;
  for (size_t i = 0; i < batch.disk_read_nodes.size(); ++i) {
    if (!batch.read_failed[i]) {
      ++disk_pages_read_;
      continue;
    }
    ++disk_read_failures_;
    // The reader pinned the slot: a node still holding that slot holds the bad record.
    const int32_t node = batch.disk_read_nodes[i];
    const prefix::Node& n = cache_.node(node);
    if (n.alive && n.disk_slot == batch.disk_read_slots[i] && !n.disk_pending) {
      cache_.release_disk_copy(node);
      repair = true;
    }
  }
  if (repair) cache_.repair_disk_closure();
}

// The request's reads landed: its prefix keeps the disk pages up to the first one that failed.
void Scheduler::land_disk_reads(Request& r, const CopyBatch& batch) {
  auto& reading = std::get<fsm::ReadingDisk>(r.state);
  int32_t verified = 0;
  while (verified < reading.num_disk_pages && !batch.read_failed[reading.first_read_row + verified]) ++verified;
  const int32_t dropped = reading.num_disk_pages - verified;
  if (dropped > 0 && r.disk_hit_counted) {
    r.num_cached_tokens -= dropped * page_size_;
    r.cached_pages_by_tier[2] -= dropped;
    prefix_hit_tokens_ -= static_cast<int64_t>(dropped) * page_size_;
    hit_tokens_by_tier_[2] -= static_cast<int64_t>(dropped) * page_size_;
  }
  r.disk_hit_counted = false;
  r.state = fsm::disk_read_done(std::move(reading), verified, page_size_);
}

void Scheduler::disk_done(int64_t step_id, std::span<const int32_t> failed_writes,
                          std::span<const int32_t> failed_reads) {
  CopyBatch* batch = nullptr;
  for (CopyBatch& b : copy_batches_)
    if (b.step_id == step_id && b.awaiting_disk) batch = &b;
  if (batch == nullptr)
    throw std::invalid_argument("disk_done(): plan " + std::to_string(step_id) +
                                " has no unacknowledged disk ops (acknowledged twice, or it had none)");
  auto check = [](std::span<const int32_t> rows, size_t count, const char* what) {
    for (int32_t row : rows)
      if (row < 0 || static_cast<size_t>(row) >= count)
        throw std::invalid_argument(std::string("disk_done(): ") + what + " row " + std::to_string(row) +
                                    " is outside the plan's " + std::to_string(count) + " rows");
  };
  check(failed_writes, batch->disk_write_nodes.size(), "failed_writes");
  check(failed_reads, batch->disk_read_nodes.size(), "failed_reads");
  batch->failed_writes.assign(failed_writes.begin(), failed_writes.end());
  batch->failed_reads.assign(failed_reads.begin(), failed_reads.end());
  batch->awaiting_disk = false;
  maybe_complete(*batch);
}

void Scheduler::stop_disk_writes() {
  disk_writes_stopped_ = true;
  for (; disk_queue_size_ > 0; --disk_queue_size_) {
    const WriteThroughEntry entry = disk_queue_[disk_queue_head_];
    disk_queue_head_ = (disk_queue_head_ + 1) % disk_queue_.size();
    const prefix::Node& n = cache_.node(entry.node);
    if (n.alive && n.key == entry.key) cache_.set_disk_queued(entry.node, false);
  }
}

std::vector<uint8_t> Scheduler::restore_disk_pages(std::span<const prefix::DiskRecord> records) {
  if (disk_.num_usable() == 0) throw std::invalid_argument("restore_disk_pages(): the scheduler has no disk tier");
  if (next_step_ != 0 || cache_.num_nodes() != 0)
    throw std::invalid_argument("restore_disk_pages(): only before the first plan, on an empty cache");
  return cache_.restore_disk(records);
}

}  // namespace lightspeed
