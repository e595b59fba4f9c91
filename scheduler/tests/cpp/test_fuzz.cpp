// Property test: random submits, aborts, plans and advances (both protocols, speculative rows with
// per-step draft counts and provisional rows behind in-flight ones, lookahead pages, cache-op
// acknowledgements, disk ops that fail, disk writes stopped, disk records restored from the
// previous episode) over random configs. After every event the scheduler recounts every page
// reference (free + owned = total on each tier, each reference has exactly one owner, finished
// requests own nothing). Every plan is checked against the copies and disk ops still in flight: no
// forward reads a page being loaded, no host page or disk slot is written while another op reads
// or writes it. At the end of each episode, once everything is finished, every device and host
// page and disk slot is free or held by the prefix cache alone.
//
// LIGHTSPEED_FUZZ_EVENTS sets the event count (default 10^5; the slow run uses 10^6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <random>
#include <map>
#include <set>
#include <stdexcept>

#include "test_util.h"

using namespace lightspeed;

namespace {

int64_t event_budget() {
  const char* env = std::getenv("LIGHTSPEED_FUZZ_EVENTS");
  return env ? std::atoll(env) : 100000;
}

// Paths the random walk must have taken, so that a green run means something.
struct Coverage {
  int64_t retractions = 0, load_backs = 0, write_backs = 0, deferred_rows = 0, speculative_rows = 0;
  int64_t provisional_rows = 0, shifted_rows = 0, drafter_plans = 0;  // per-step drafts under overlap
  int64_t aborts = 0, prefix_hits = 0, finished = 0;
  int64_t late_acks = 0, aborts_mid_copy = 0;  // async_copies: acks after advance(), aborts while loading
  int64_t disk_writes = 0, disk_reads = 0, disk_hits = 0, failed_reads = 0, failed_writes = 0, restored = 0;
  int64_t aborts_mid_read = 0, writes_stopped = 0;
  int64_t spare_slot_rows = 0;  // rows of a request in a slot past max_num_seqs
};

// A disk write that landed: what an engine would find in the slot after a restart.
struct DiskEntry {
  uint64_t key, parent_key;
  int32_t depth;
  std::vector<int32_t> tokens;
};
using DiskImage = std::map<int32_t, DiskEntry>;  // slot -> record

// Host pages and disk slots an op in flight reads or writes.
struct Busy {
  std::set<int32_t> host_read, host_written, slot_read, slot_written;
  int32_t num_reads = 0;  // disk_read rows
};

struct Episode {
  std::mt19937_64& rng;
  Scheduler s;
  std::set<int64_t> live;
  std::set<int64_t> aborted;  // aborted, not yet reported
  std::deque<Plan*> in_flight;
  std::vector<int64_t> unacked_copies;  // async_copies: steps whose copies have not "landed" yet
  std::vector<int64_t> unacked_disk;    // async_copies: steps whose disk ops are not done yet
  std::map<int64_t, Busy> copies_busy, disk_busy;  // per step, until its copies / disk ops are acked
  std::map<int64_t, std::vector<std::pair<int32_t, DiskEntry>>> pending_writes;  // per step
  DiskImage& disk_image;
  // Device pages that copies not yet acknowledged write (load_back destinations) or read
  // (write_back sources), per step: no forward may read the former or overwrite either.
  std::map<int64_t, std::set<int32_t>> loading_pages, copied_out_pages;
  // Drafts a request's previous row rejected while its next row was in flight (that row's shift).
  std::map<int64_t, int32_t> pending_shift;
  std::vector<int32_t> draft_counts, draft_tokens;  // the drafter of the latest plan, by slot
  int32_t draft_width = 0;
  int64_t events = 0;
  int32_t next_rid = 0;

  Coverage& coverage;

  Episode(std::mt19937_64& r, const SchedulerConfig& config, Coverage& c, DiskImage& image)
      : rng(r), s(config), disk_image(image), coverage(c) {
    if (config.num_disk_pages > 0) restore();
  }

  // The previous episode's disk, as an engine restarted on it would offer it (the scheduler
  // rejects records that do not fit this config or chain to their parents).
  void restore() {
    std::vector<prefix::DiskRecord> records;
    for (auto& [slot, entry] : disk_image)
      if (static_cast<int32_t>(entry.tokens.size()) == s.config().page_size)
        records.push_back({slot, entry.key, entry.parent_key, entry.depth, entry.tokens.data()});
    const auto accepted = s.restore_disk_pages(records);
    for (uint8_t a : accepted) coverage.restored += a;
    DiskImage kept;  // the records point into disk_image: build the new one first
    for (size_t i = 0; i < records.size(); ++i)
      if (accepted[i])
        kept[records[i].slot] = {records[i].key, records[i].parent_key, records[i].depth,
                                 std::vector<int32_t>(records[i].tokens, records[i].tokens + s.config().page_size)};
    disk_image.swap(kept);
    s.check_invariants();
  }

  int32_t uniform(int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); }

  void submit() {
    const auto& config = s.config();
    RequestSpec spec;
    spec.rid = "r" + std::to_string(next_rid++);
    // A few shared prefixes over a tiny vocabulary: prefix hits, duplicate pages and collisions
    // of content under different parents all happen.
    const int32_t family = uniform(0, 3);
    const int32_t length = uniform(1, std::min(config.max_model_len, 4 * config.page_size + 9));
    for (int32_t i = 0; i < length; ++i) spec.token_ids.push_back(i < length / 2 ? (family * 7 + i) % 11 : uniform(0, 10));
    spec.max_new_tokens = uniform(1, 12);
    spec.eos_token_ids = {2};
    spec.stop_token_ids = uniform(0, 3) == 0 ? std::vector<int32_t>{5} : std::vector<int32_t>{};
    spec.ignore_eos = uniform(0, 4) == 0;
    spec.priority = uniform(-1, 1);
    spec.num_draft_tokens = config.max_num_draft_tokens > 0 ? uniform(0, config.max_num_draft_tokens) : 0;
    if (uniform(0, 30) == 0) spec.token_ids.clear();  // invalid: must throw and change nothing
    try {
      live.insert(s.submit(spec));
    } catch (const std::invalid_argument&) {
      // Empty prompts, or prompts larger than the device pool.
    }
  }

  void abort_one() {
    std::vector<int64_t> candidates;
    for (int64_t id : live)
      if (!aborted.count(id)) candidates.push_back(id);
    if (candidates.empty()) return;
    const int64_t id = candidates[uniform(0, static_cast<int32_t>(candidates.size()) - 1)];
    const std::string state = s.request_stats(id).state;
    if (s.config().async_copies && (state == "loading_prefix" || state == "retracting")) ++coverage.aborts_mid_copy;
    if (state == "reading_disk") ++coverage.aborts_mid_read;
    s.abort(id);  // reported by the next advance()
    aborted.insert(id);
    ++coverage.aborts;
  }

  void forget_copies(int64_t step) {
    loading_pages.erase(step);
    copied_out_pages.erase(step);
    copies_busy.erase(step);
  }

  // Host pages and disk slots: what a new plan's copies and disk ops touch must be free of every
  // op in flight, and its disk ops (run beside its copies) must not touch what its copies do.
  void check_io_hazards(const Plan& plan) {
    Busy copies, disk;
    for (size_t i = 0; i < plan.write_back.size(); i += 2) copies.host_written.insert(plan.write_back[i + 1]);
    for (size_t i = 0; i < plan.load_back.size(); i += 2) copies.host_read.insert(plan.load_back[i]);
    for (size_t i = 0; i < plan.disk_write.size(); i += 2) {
      disk.host_read.insert(plan.disk_write[i]);
      ASSERT_TRUE(disk.slot_written.insert(plan.disk_write[i + 1]).second) << "one plan writes a slot twice";
    }
    disk.num_reads = static_cast<int32_t>(plan.disk_read.size() / 2);
    for (size_t i = 0; i < plan.disk_read.size(); i += 2) {
      disk.slot_read.insert(plan.disk_read[i]);
      ASSERT_TRUE(disk.host_written.insert(plan.disk_read[i + 1]).second) << "two reads fill one host page";
    }
    auto disjoint = [](const std::set<int32_t>& a, const std::set<int32_t>& b) {
      for (int32_t x : a)
        if (b.count(x)) return false;
      return true;
    };
    for (int32_t slot : disk.slot_read) ASSERT_EQ(disk.slot_written.count(slot), 0u) << "a slot read while written";
    ASSERT_TRUE(disjoint(disk.host_written, copies.host_written) && disjoint(disk.host_written, copies.host_read))
        << "a disk read fills a host page this plan's copies use";
    ASSERT_TRUE(disjoint(disk.host_read, copies.host_written)) << "a disk write reads a page being copied in";
    for (const auto* busy_map : {&copies_busy, &disk_busy})
      for (const auto& [step, busy] : *busy_map) {
        for (const Busy* mine : {&copies, &disk}) {
          ASSERT_TRUE(disjoint(mine->host_written, busy.host_read) && disjoint(mine->host_written, busy.host_written))
              << "host page overwritten while step " << step << " uses it";
          ASSERT_TRUE(disjoint(mine->host_read, busy.host_written)) << "host page read before step " << step << " filled it";
          ASSERT_TRUE(disjoint(mine->slot_written, busy.slot_read) && disjoint(mine->slot_written, busy.slot_written))
              << "disk slot overwritten while step " << step << " uses it";
          ASSERT_TRUE(disjoint(mine->slot_read, busy.slot_written)) << "disk slot read before step " << step << " wrote it";
        }
      }
    if (plan.has_copies) copies_busy[plan.step_id] = copies;
    if (plan.has_disk_ops) {
      disk_busy[plan.step_id] = disk;
      const int32_t ps = s.config().page_size;
      auto& writes = pending_writes[plan.step_id];
      for (size_t i = 0; i < plan.disk_write.size() / 2; ++i)
        writes.push_back({plan.disk_write[2 * i + 1],
                          {plan.disk_write_keys[3 * i], plan.disk_write_keys[3 * i + 1],
                           static_cast<int32_t>(plan.disk_write_keys[3 * i + 2]),
                           std::vector<int32_t>(plan.disk_write_tokens.begin() + i * ps,
                                                plan.disk_write_tokens.begin() + (i + 1) * ps)}});
    }
  }

  // Disk ops finish with some reads and writes failed (a torn record, a full disk).
  void finish_disk(int64_t step, bool may_fail) {
    const Busy busy = disk_busy[step];
    std::vector<int32_t> failed_writes, failed_reads;
    auto& writes = pending_writes[step];
    for (size_t row = 0; row < writes.size(); ++row) {
      if (may_fail && uniform(0, 7) == 0) {
        failed_writes.push_back(static_cast<int32_t>(row));
        disk_image.erase(writes[row].first);  // whatever the slot held is torn now
      } else {
        disk_image[writes[row].first] = writes[row].second;
      }
    }
    for (int32_t row = 0; may_fail && row < busy.num_reads; ++row)
      if (uniform(0, 7) == 0) failed_reads.push_back(row);
    coverage.failed_writes += static_cast<int64_t>(failed_writes.size());
    coverage.failed_reads += static_cast<int64_t>(failed_reads.size());
    s.disk_done(step, failed_writes, failed_reads);
    disk_busy.erase(step);
    pending_writes.erase(step);
  }

  // The copies of a new plan start after every earlier forward and may run beside later ones.
  void check_copy_hazards(const Plan& plan) {
    const int32_t ps = s.config().page_size;
    std::set<int32_t> own_out;
    for (size_t i = 0; i < plan.write_back.size(); i += 2) own_out.insert(plan.write_back[i]);
    std::set<int32_t> own_in;
    for (size_t i = 1; i < plan.load_back.size(); i += 2) own_in.insert(plan.load_back[i]);
    for (int32_t b = 0; b < plan.num_rows; ++b) {
      const int32_t used = (plan.seq_lens[b] + ps - 1) / ps;
      for (int32_t p = 0; p < used; ++p) {
        const int32_t page = plan.page_table[b * plan.pages_per_row + p];
        ASSERT_EQ(own_in.count(page), 0u) << "a row reads a page its own plan is loading";
        for (const auto& [step, pages] : loading_pages)
          ASSERT_EQ(pages.count(page), 0u) << "a row reads page " << page << " still loading for step " << step;
      }
    }
    for (int32_t t = 0; t < plan.num_tokens; ++t) {
      const auto page = static_cast<int32_t>(plan.slot_mapping[t] / ps);
      if (own_out.count(page)) ASSERT_TRUE(plan.forward_waits_for_copies) << "forward overwrites a page being copied";
      if (!s.config().async_copies) continue;
      for (const auto& [step, pages] : copied_out_pages)
        ASSERT_EQ(pages.count(page), 0u) << "forward overwrites page " << page << " copied out by step " << step;
    }
    if (plan.has_copies) {
      loading_pages[plan.step_id] = own_in;
      // A forward that waits for its plan's copies proves them landed to every later plan.
      if (!plan.forward_waits_for_copies) copied_out_pages[plan.step_id] = own_out;
    }
  }

  void advance_oldest() {
    Plan& plan = *in_flight.front();
    in_flight.pop_front();
    if (!s.config().async_copies) {
      forget_copies(plan.step_id);
      if (plan.has_disk_ops) finish_disk_sync(plan.step_id);
    }
    std::vector<int32_t> sampled(plan.num_samples);
    for (auto& token : sampled) token = uniform(0, 10);
    std::vector<int32_t> accepted;
    bool speculative = false;
    for (int32_t b = 0; b < plan.num_decodes; ++b) {
      accepted.push_back(uniform(1, plan.rows[b].num_samples));
      speculative |= plan.rows[b].num_samples > 1;
    }
    check_true_starts(plan, accepted);
    const auto& finished = s.advance(plan, sampled, speculative || uniform(0, 1) ? accepted : std::vector<int32_t>{});
    coverage.finished += static_cast<int64_t>(finished.size());
    for (int32_t b = 0; b < plan.num_decodes; ++b)
      ASSERT_LE(plan.appended_counts[b], accepted[b]);
    for (const auto& f : finished) {
      ASSERT_EQ(live.erase(f.req_id), 1u) << "reported twice or unknown";
      ASSERT_EQ(aborted.erase(f.req_id), f.reason == fsm::FinishReason::kAbort ? 1u : 0u);
    }
  }

  // Whatever the shifts, a decode row's true start (planned start minus the drafts its in-flight
  // predecessor rejected) is the request's known length minus one when the row is advanced.
  void check_true_starts(const Plan& plan, const std::vector<int32_t>& accepted) {
    const Plan* newer = in_flight.empty() ? nullptr : in_flight.front();
    for (int32_t b = 0; b < plan.num_decodes; ++b) {
      const int64_t id = plan.req_ids[b];
      int32_t shift = 0;
      if (auto it = pending_shift.find(id); it != pending_shift.end()) {
        if (plan.rows[b].provisional) shift = it->second;
        pending_shift.erase(it);
      }
      coverage.shifted_rows += shift > 0;
      if (!live.count(id) || aborted.count(id)) continue;
      const auto st = s.request_stats(id);
      const std::string state = st.state;
      if (state == "finished") continue;  // finished by an earlier advance: the row is void
      ASSERT_EQ(plan.rows[b].kv_start - shift, st.num_prompt_tokens + st.num_output_tokens - 1)
          << "request " << id << " row " << b << " of step " << plan.step_id;
      if (newer != nullptr && row_of_request(*newer, id) >= 0 && plan.rows[b].num_samples > 1)
        pending_shift[id] = plan.rows[b].num_samples - accepted[b];
    }
  }

  static int32_t row_of_request(const Plan& plan, int64_t id) {
    for (int32_t b = 0; b < plan.num_rows; ++b)
      if (plan.req_ids[b] == id) return b;
    return -1;
  }

  // Half the plans take per-step draft counts (and, mostly, tokens) from a random drafter.
  DraftInput random_drafts() {
    const auto& config = s.config();
    if (config.max_num_draft_tokens == 0 || uniform(0, 1) == 0) {
      draft_counts.clear();
      draft_tokens.clear();
      return {};
    }
    draft_width = config.max_num_draft_tokens;
    draft_counts.assign(config.num_slots(), 0);
    for (auto& count : draft_counts) count = uniform(0, config.max_num_draft_tokens);
    draft_tokens.assign(static_cast<size_t>(config.num_slots()) * draft_width, 0);
    for (auto& token : draft_tokens) token = uniform(0, 10);
    ++coverage.drafter_plans;
    if (uniform(0, 3) == 0) {
      draft_tokens.clear();  // a device drafter: 0 at the draft slots
      return DraftInput{draft_counts, {}, 0};
    }
    return DraftInput{draft_counts, draft_tokens, draft_width};
  }

  // A slot indexes a request's state on the device: a new plan never gives a request the slot of another
  // request that is still live (unfinished, not aborted) with a row in a plan in flight. Once a request has
  // finished or been aborted, its rows in flight are discarded and the stream order keeps the new binding
  // behind them. Spare slots never make a plan wider than max_num_seqs.
  void check_slots(const Plan& plan) {
    const auto& config = s.config();
    ASSERT_LE(plan.num_rows, config.max_num_seqs);
    std::set<int32_t> seen;
    for (int32_t b = 0; b < plan.num_rows; ++b) {
      const int32_t slot = plan.req_slots[b];
      ASSERT_TRUE(slot >= 0 && slot < config.num_slots()) << "slot " << slot << " out of range";
      ASSERT_TRUE(seen.insert(slot).second) << "two rows of one plan share slot " << slot;
      coverage.spare_slot_rows += slot >= config.max_num_seqs;
      for (const Plan* older : in_flight)
        for (int32_t c = 0; c < older->num_rows; ++c)
          if (const int64_t owner = older->req_ids[c]; older->req_slots[c] == slot && owner != plan.req_ids[b])
            ASSERT_TRUE(live.count(owner) == 0 || aborted.count(owner) == 1)
                << "slot " << slot << " given to " << plan.req_ids[b] << " while live request " << owner
                << " uses it in step " << older->step_id;
    }
  }

  // Every plan agrees with itself: the page table (filled incrementally) maps each token to the
  // slot the row computed, rows are padded with page 0, no two new tokens share a KV slot, and
  // deferred inputs point into the in-flight plan's samples.
  void check_plan(const Plan& plan, int32_t previous_samples) {
    const int32_t ps = s.config().page_size;
    std::set<int64_t> written;
    ASSERT_EQ(plan.query_start_loc[0], 0);
    for (int32_t b = 0; b < plan.num_rows; ++b) {
      const int32_t begin = plan.query_start_loc[b], end = plan.query_start_loc[b + 1];
      ASSERT_EQ(end - begin, plan.seq_lens[b] - plan.cached_lens[b]);
      const int32_t used = (plan.seq_lens[b] + plan.rows[b].lookahead + ps - 1) / ps;
      ASSERT_LE(plan.seq_lens[b] + plan.rows[b].lookahead, s.config().max_model_len);
      if (b >= plan.num_decodes) ASSERT_EQ(plan.rows[b].lookahead, 0);
      for (int32_t p = 0; p < plan.pages_per_row; ++p) {
        const int32_t page = plan.page_table[b * plan.pages_per_row + p];
        ASSERT_EQ(page == 0, p >= used) << "row " << b << " page " << p;
      }
      if (b < plan.num_decodes && !draft_counts.empty()) {
        ASSERT_LE(end - begin - 1, draft_counts[plan.req_slots[b]]) << "more drafts than the drafter asked for";
        for (int32_t j = 1; j < end - begin; ++j)
          ASSERT_EQ(plan.input_ids[begin + j],
                    draft_tokens.empty() ? 0 : draft_tokens[plan.req_slots[b] * draft_width + j - 1]);
      }
      for (int32_t t = begin; t < end; ++t) {
        const int64_t pos = plan.positions[t];
        ASSERT_EQ(pos, plan.cached_lens[b] + (t - begin));
        ASSERT_EQ(plan.slot_mapping[t], int64_t(plan.page_table[b * plan.pages_per_row + pos / ps]) * ps + pos % ps);
        ASSERT_TRUE(written.insert(plan.slot_mapping[t]).second) << "two tokens write one KV slot";
        if (plan.deferred_input_mask[t]) {
          ASSERT_GE(plan.deferred_src_index[t], 0);
          ASSERT_LT(plan.deferred_src_index[t], previous_samples);
        }
      }
    }
    for (int32_t i = 0; i < plan.num_samples; ++i) {
      const int32_t row = plan.sample_batch_rows[i];
      ASSERT_GE(plan.logits_indices[i], plan.query_start_loc[row]);
      ASSERT_LT(plan.logits_indices[i], plan.query_start_loc[row + 1]);
    }
  }

  // Synchronous protocol: advance() acknowledged the disk ops as done, none failed.
  void finish_disk_sync(int64_t step) {
    for (auto& [slot, entry] : pending_writes[step]) disk_image[slot] = entry;
    disk_busy.erase(step);
    pending_writes.erase(step);
  }

  // Copies and disk ops land in any order, some long after their plan was advanced.
  void ack_copies() {
    const bool disk = !unacked_disk.empty() && (unacked_copies.empty() || uniform(0, 1) == 1);
    auto& list = disk ? unacked_disk : unacked_copies;
    if (list.empty()) return;
    const auto i = static_cast<size_t>(uniform(0, static_cast<int32_t>(list.size()) - 1));
    if (disk) {
      finish_disk(list[i], true);
    } else {
      s.copies_done(list[i]);
      forget_copies(list[i]);
    }
    ++coverage.late_acks;
    list.erase(list.begin() + static_cast<ptrdiff_t>(i));
    EXPECT_THROW(s.copies_done(-5), std::invalid_argument);
  }

  void event() {
    const int32_t dice = uniform(0, 99);
    const bool overlap = uniform(0, 1) == 1;
    if (dice < 20) {
      submit();
    } else if (dice < 24) {
      abort_one();
    } else if (dice < 34 && s.config().async_copies) {
      ack_copies();
    } else if (dice == 34 && s.config().num_disk_pages > 0 && uniform(0, 30) == 0) {
      s.stop_disk_writes();  // the disk is full
      ++coverage.writes_stopped;
    } else if (in_flight.empty() || (overlap && in_flight.size() < 2)) {
      const int32_t previous_samples = in_flight.empty() ? 0 : in_flight.back()->num_samples;
      Plan& plan = s.next_plan(random_drafts());
      check_plan(plan, previous_samples);
      check_slots(plan);
      check_copy_hazards(plan);
      check_io_hazards(plan);
      in_flight.push_back(&plan);
      if (plan.has_copies && s.config().async_copies) unacked_copies.push_back(plan.step_id);
      if (plan.has_disk_ops && s.config().async_copies) unacked_disk.push_back(plan.step_id);
      coverage.disk_writes += static_cast<int64_t>(plan.disk_write.size() / 2);
      coverage.disk_reads += static_cast<int64_t>(plan.disk_read.size() / 2);
      coverage.load_backs += static_cast<int64_t>(plan.load_back.size() / 2);
      coverage.write_backs += static_cast<int64_t>(plan.write_back.size() / 2);
      for (int32_t t = 0; t < plan.num_tokens; ++t) coverage.deferred_rows += plan.deferred_input_mask[t];
      for (int32_t b = 0; b < plan.num_decodes; ++b) {
        coverage.speculative_rows += plan.rows[b].num_samples > 1;
        coverage.provisional_rows += plan.rows[b].provisional;
      }
    } else {
      advance_oldest();
    }
    ++events;
    s.check_invariants();
  }

  void drain() {
    for (int64_t id : live)
      if (!aborted.count(id)) s.abort(id);
    aborted.insert(live.begin(), live.end());
    while (!in_flight.empty()) advance_oldest();
    // Queued write-throughs are emitted and acknowledged by (possibly empty) plans.
    for (int i = 0; s.has_pending_copies() || s.has_unfinished(); ++i) {
      ASSERT_LT(i, 10000) << "copies never drain";
      while (!unacked_copies.empty() || !unacked_disk.empty()) ack_copies();
      Plan& plan = s.next_plan();
      check_io_hazards(plan);
      if (plan.has_copies && s.config().async_copies) unacked_copies.push_back(plan.step_id);
      if (plan.has_disk_ops && s.config().async_copies) unacked_disk.push_back(plan.step_id);
      in_flight.push_back(&plan);
      advance_oldest();
    }
    s.check_invariants();
    ASSERT_TRUE(live.empty());
    coverage.retractions += s.stats().num_retractions;
    coverage.prefix_hits += s.stats().prefix_hit_tokens;
    coverage.disk_hits += s.stats().disk_hit_tokens;
    const auto stats = s.stats();
    EXPECT_EQ(stats.free_disk_pages + stats.cached_disk_pages, std::max(stats.num_disk_pages - 1, 0));
    EXPECT_EQ(stats.num_disk_writing, 0);
    EXPECT_EQ(stats.device_hit_tokens + stats.host_hit_tokens + stats.disk_hit_tokens, stats.prefix_hit_tokens);
    EXPECT_EQ(stats.free_device_pages + stats.cached_device_pages, stats.num_device_pages - 1);
    EXPECT_EQ(stats.unreferenced_cached_device_pages, stats.cached_device_pages);  // no request is left
    EXPECT_EQ(stats.free_host_pages + stats.cached_host_pages, std::max(stats.num_host_pages - 1, 0));
    EXPECT_EQ(stats.num_writing_back, 0);
    EXPECT_EQ(stats.num_copy_batches, 0);
  }
};

SchedulerConfig random_config(std::mt19937_64& rng) {
  auto pick = [&](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
  SchedulerConfig config;
  config.page_size = 1 << pick(0, 3);
  config.num_device_pages = pick(8, 48);
  config.num_host_pages = pick(2, 48);
  config.max_num_seqs = pick(1, 8);
  config.max_num_batched_tokens = pick(4, 64);
  config.chunked_prefill_size = pick(1, 32);
  config.max_model_len = pick(8, 96);
  config.policy = pick(0, 3) == 0 ? "prefill_first" : "decode_first";
  config.enable_prefix_cache = pick(0, 4) != 0;
  config.max_num_draft_tokens = pick(0, 1) ? pick(1, 3) : 0;
  config.async_copies = pick(0, 1) == 1;
  config.max_write_through_pages = pick(1, 16);
  config.num_lookahead_tokens = pick(0, 2) == 0 ? pick(1, 4) : 0;
  config.num_spare_slots = pick(0, 1) ? pick(1, config.max_num_seqs) : 0;
  if (pick(0, 9) == 0) config.num_host_pages = 0;  // host tier off
  if (config.num_host_pages > 0 && pick(0, 1) == 0) {
    config.num_disk_pages = pick(2, 64);
    config.max_disk_write_pages = pick(1, 8);
  }
  return config;
}

}  // namespace

TEST(Fuzz, RandomEventsKeepEveryInvariant) {
  std::mt19937_64 rng(20261129);
  const int64_t budget = event_budget();
  int64_t events = 0;
  int32_t episodes = 0;
  Coverage coverage;
  // What the disk holds when an episode ends, offered to the next one of the same page size.
  std::map<int32_t, DiskImage> disk_images;
  while (events < budget) {
    const SchedulerConfig config = random_config(rng);
    Episode episode(rng, config, coverage, disk_images[config.page_size]);
    const int64_t length = std::min<int64_t>(2000, budget - events);
    while (episode.events < length) {
      episode.event();
      if (::testing::Test::HasFatalFailure()) return;
    }
    episode.drain();
    events += episode.events;
    ++episodes;
  }
  EXPECT_GE(events, budget);
  std::printf("fuzz: %lld events, %d episodes, %lld finished, %lld aborts, %lld retractions, %lld load-backs, "
              "%lld write-backs, %lld deferred inputs, %lld speculative rows, %lld prefix-hit tokens\n",
              static_cast<long long>(events), episodes, static_cast<long long>(coverage.finished),
              static_cast<long long>(coverage.aborts), static_cast<long long>(coverage.retractions),
              static_cast<long long>(coverage.load_backs), static_cast<long long>(coverage.write_backs),
              static_cast<long long>(coverage.deferred_rows), static_cast<long long>(coverage.speculative_rows),
              static_cast<long long>(coverage.prefix_hits));
  std::printf("fuzz: %lld late copy acknowledgements, %lld aborts while a copy was in flight\n",
              static_cast<long long>(coverage.late_acks), static_cast<long long>(coverage.aborts_mid_copy));
  std::printf("fuzz: %lld disk writes (%lld failed), %lld disk reads (%lld failed), %lld disk-hit tokens, "
              "%lld pages restored, %lld aborts while reading, %lld stops\n",
              static_cast<long long>(coverage.disk_writes), static_cast<long long>(coverage.failed_writes),
              static_cast<long long>(coverage.disk_reads), static_cast<long long>(coverage.failed_reads),
              static_cast<long long>(coverage.disk_hits), static_cast<long long>(coverage.restored),
              static_cast<long long>(coverage.aborts_mid_read), static_cast<long long>(coverage.writes_stopped));
  std::printf("fuzz: %lld plans with per-step drafts, %lld provisional rows, %lld of them shifted, "
              "%lld rows in spare slots\n",
              static_cast<long long>(coverage.drafter_plans), static_cast<long long>(coverage.provisional_rows),
              static_cast<long long>(coverage.shifted_rows), static_cast<long long>(coverage.spare_slot_rows));
  EXPECT_GT(coverage.retractions, 0);
  EXPECT_GT(coverage.spare_slot_rows, 0);
  EXPECT_GT(coverage.load_backs, 0);
  EXPECT_GT(coverage.write_backs, 0);
  EXPECT_GT(coverage.deferred_rows, 0);
  EXPECT_GT(coverage.speculative_rows, 0);
  EXPECT_GT(coverage.aborts, 0);
  EXPECT_GT(coverage.prefix_hits, 0);
  EXPECT_GT(coverage.late_acks, 0);
  EXPECT_GT(coverage.aborts_mid_copy, 0);
  EXPECT_GT(coverage.disk_writes, 0);
  EXPECT_GT(coverage.disk_reads, 0);
  EXPECT_GT(coverage.disk_hits, 0);
  EXPECT_GT(coverage.failed_reads, 0);
  EXPECT_GT(coverage.failed_writes, 0);
  EXPECT_GT(coverage.restored, 0);
  EXPECT_GT(coverage.aborts_mid_read, 0);
  EXPECT_GT(coverage.writes_stopped, 0);
  EXPECT_GT(coverage.drafter_plans, 0);
  EXPECT_GT(coverage.provisional_rows, 0);
  EXPECT_GT(coverage.shifted_rows, 0);
}
