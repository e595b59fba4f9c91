// KV copies between the tiers: write-through of prefix pages to host, and the batches of copies
// the engine runs beside the forward and acknowledges when they land.
//
// Design note (write-through). A prefix page reaches host as soon as the cache knows it (after
// every prefill chunk, at prompt completion, at finish), in the background: queued here, emitted
// by the following plans at most max_write_through_pages in flight, so the copies use a bounded
// share of PCIe and a decode never waits for them. A finished request therefore owns nothing: the
// cache node owns its page, and a node being written (host_pending) cannot be evicted from either
// tier. Pages already on host are skipped; a queued node evicted from device before its turn is
// simply not written (the cache is a cache). A node is written only once its parent has a host
// copy: host copies, like device ones, form prefixes of the tree.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "fsm/transitions.h"
#include "scheduler.h"

namespace lightspeed {

void Scheduler::queue_write_through(int32_t node) {
  const prefix::Node& n = cache_.node(node);
  if (n.host_page >= 0) return queue_disk_write(node);  // on host already: on to disk, if not there
  if (host_.num_usable() == 0 || n.host_queued) return;
  if (write_through_size_ == write_through_.size()) return;  // full: this page stays device-only
  write_through_[(write_through_head_ + write_through_size_) % write_through_.size()] = {node, n.key};
  ++write_through_size_;
  cache_.set_host_queued(node, true);
}

void Scheduler::emit_write_through(Plan& plan) {
  // Nothing in this loop makes a host copy evictable, so after one eviction finds none, none will:
  // later pages skip the scan (a full host tier of spared prefixes would otherwise cost a scan of
  // every host copy per page).
  bool host_may_evict = true;
  while (write_through_size_ > 0 && write_through_in_flight_ < config_.max_write_through_pages) {
    const WriteThroughEntry entry = write_through_[write_through_head_];
    write_through_head_ = (write_through_head_ + 1) % write_through_.size();
    --write_through_size_;
    const prefix::Node& n = cache_.node(entry.node);
    if (!n.alive || n.key != entry.key || !n.host_queued) continue;  // removed (and maybe reused)
    cache_.set_host_queued(entry.node, false);
    if (n.device_page < 0 || n.device_pending || n.host_page >= 0) continue;
    int32_t host_page = host_.allocate();
    // A copy for later never displaces the prefix of a waiting request (scheduler_eviction.cpp).
    if (host_page < 0 && host_may_evict) {
      host_may_evict = cache_.evict_host(1, spare_epoch_) > 0;
      if (host_may_evict) host_page = host_.allocate();
    }
    if (host_page < 0) continue;  // host full of pages in use: this one stays device-only
    // Host copies stay closed under parent, like device ones: a device-only page with a host-only
    // child could never be evicted from the device (dropping its only copy would orphan the
    // child), and a full host tier would then pin the device cache for good. (Checked after the
    // eviction above, which may have taken the parent's host copy.)
    if (n.parent != prefix::RadixCache::kRoot && cache_.node(n.parent).host_page < 0) {
      host_.release(host_page);
      continue;
    }
    cache_.begin_write_back(entry.node, host_page);
    plan.write_back.push_back(n.device_page);
    plan.write_back.push_back(host_page);
    building_.write_nodes.push_back(entry.node);
    ++write_through_in_flight_;
  }
}

// Called at the end of next_plan(): the plan's copies and disk ops become a batch in flight.
void Scheduler::seal_copies(Plan& plan) {
  const bool copies = !plan.write_back.empty() || !plan.load_back.empty();
  const bool disk = !plan.disk_write.empty() || !plan.disk_read.empty();
  if (building_.empty() && !copies && !disk) return;
  building_.step_id = plan.step_id;
  building_.awaiting_copies = copies || !disk;
  building_.awaiting_disk = disk;
  plan.has_copies = building_.awaiting_copies;
  plan.has_disk_ops = disk;
  copy_batches_.push_back(std::move(building_));
  if (spare_batches_.empty()) {
    building_ = CopyBatch{};
  } else {
    building_ = std::move(spare_batches_.back());
    spare_batches_.pop_back();
  }
}

Scheduler::CopyBatch* Scheduler::find_batch(int64_t step_id) {
  for (CopyBatch& batch : copy_batches_)
    if (batch.step_id == step_id) return &batch;
  return nullptr;
}

void Scheduler::copies_done(int64_t step_id) {
  for (CopyBatch& batch : copy_batches_) {
    if (batch.step_id == step_id && batch.awaiting_copies) {
      batch.awaiting_copies = false;
      return maybe_complete(batch);
    }
  }
  throw std::invalid_argument("copies_done(): plan " + std::to_string(step_id) +
                              " has no unacknowledged copies (acknowledged twice, or it had none)");
}

void Scheduler::maybe_complete(CopyBatch& batch) {
  if (batch.awaiting_copies || batch.awaiting_disk) return;
  complete_batch(static_cast<size_t>(&batch - copy_batches_.data()));
}

void Scheduler::complete_batch(size_t index) {
  CopyBatch& batch = copy_batches_[index];
  for (int32_t node : batch.write_nodes) {
    cache_.end_write_back(node);
    queue_disk_write(node);  // its host copy landed: on to disk
  }
  write_through_in_flight_ -= static_cast<int32_t>(batch.write_nodes.size());
  for (int32_t node : batch.load_nodes) cache_.end_load(node);
  settle_disk_ops(batch);
  for (int64_t req_id : batch.waiters) {
    auto it = record_of_.find(req_id);
    if (it == record_of_.end()) continue;  // aborted and already recycled
    const int32_t record = it->second;
    Request& r = records_[record];
    if (r.copy_step != batch.step_id) continue;  // aborted (its pages are in batch.held)
    r.copy_step = -1;
    if (std::holds_alternative<fsm::ReadingDisk>(r.state)) {
      land_disk_reads(r, batch);  // stays in loading_: the next plan with room loads what it read
    } else if (auto* loading = std::get_if<fsm::LoadingPrefix>(&r.state)) {
      r.state = fsm::copy_done(std::move(*loading));
      erase_from(loading_, record);
      insert_sorted(running_, record);
    } else if (auto* retracting = std::get_if<fsm::Retracting>(&r.state)) {
      r.state = fsm::copy_done(std::move(*retracting));
    }
    // Any other state: it finished while its retraction copy was in flight (overlap).
  }
  // Pages these copies pinned (host_pending, device_pending) may be evictable now: a request
  // blocked on device capacity gets another look.
  blocked_req_id_ = -1;
  batch.write_nodes.clear();
  batch.load_nodes.clear();
  batch.disk_write_nodes.clear();
  batch.disk_read_nodes.clear();
  batch.disk_read_slots.clear();
  batch.failed_writes.clear();
  batch.failed_reads.clear();
  batch.waiters.clear();
  batch.held.clear();  // the copies landed: pages of aborted requests go back now
  spare_batches_.push_back(std::move(batch));
  copy_batches_.erase(copy_batches_.begin() + static_cast<ptrdiff_t>(index));
}

// An aborted request whose copy is in flight hands its pages to the copy's batch: freeing them
// now would let a forward or another copy reuse a page the DMA engine is still reading or writing.
void Scheduler::hold_for_copy(Request& r) {
  if (r.copy_step < 0) return;
  CopyBatch* batch = find_batch(r.copy_step);
  r.copy_step = -1;
  if (batch == nullptr) return;
  if (auto* loading = std::get_if<fsm::LoadingPrefix>(&r.state)) {
    batch->held.push_back(std::move(loading->device_pages));
    batch->held.push_back(std::move(loading->host_pages));
  } else if (auto* reading = std::get_if<fsm::ReadingDisk>(&r.state)) {
    batch->held.push_back(std::move(reading->device_pages));
    batch->held.push_back(std::move(reading->host_pages));
    batch->held.push_back(std::move(reading->disk_slots));
  } else if (auto* retracting = std::get_if<fsm::Retracting>(&r.state)) {
    batch->held.push_back(std::move(retracting->host_pages));
  }
}

}  // namespace lightspeed
