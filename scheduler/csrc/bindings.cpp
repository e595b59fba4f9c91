// Python bindings (nanobind): the only file that knows about Python.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "draft/proposer.h"
#include "scheduler.h"

namespace nb = nanobind;
using namespace nb::literals;
using lightspeed::Plan;
using lightspeed::RequestSpec;
using lightspeed::Scheduler;
using lightspeed::SchedulerConfig;

namespace {

// Keeps one plan buffer's memory alive; the owner of every numpy view of that buffer. It holds
// no reference to the scheduler, so cached views form no reference cycle with it.
struct PlanBuffer {
  std::shared_ptr<Plan> plan;
};

enum Field : int {
  kReqIds, kReqSlots, kInputIds, kPositions, kQueryStartLoc, kSeqLens, kCachedLens, kPageTable,
  kSlotMapping, kLogitsIndices, kSampleBatchRows, kDeferredMask, kDeferredSrc, kLoadBack, kWriteBack,
  kDiskWrite, kDiskWriteKeys, kDiskWriteTokens, kDiskRead, kDiskReadKeys, kDiskReadTokens, kAppendedCounts,
  kNumFields
};

// Python's Plan: one per buffer. Creating a numpy view costs about a microsecond, so views are
// cached and recreated only when a buffer's shape (or storage) changes; in steady decoding the
// same array objects come back every step, refilled in place.
struct PyPlan {
  Plan* plan = nullptr;
  int32_t page_size = 0;
  nb::object buffer;  // PlanBuffer
  struct Cached {
    nb::object array;
    const void* data = nullptr;
    size_t rows = SIZE_MAX, cols = SIZE_MAX;
  };
  std::array<Cached, kNumFields> views;

  template <class T>
  nb::object view(Field field, T* data, size_t rows, size_t cols = 0) {
    Cached& c = views[field];
    if (!c.array.is_valid() || c.data != data || c.rows != rows || c.cols != cols) {
      using Array = nb::ndarray<nb::numpy, T>;
      Array array = cols == 0 ? Array(data, {rows}, buffer) : Array(data, {rows, cols}, buffer);
      c.array = nb::cast(array);
      c.data = data;
      c.rows = rows;
      c.cols = cols;
    }
    return c.array;
  }
};

// Python's Scheduler: the core plus the two Python plans.
struct PyScheduler {
  Scheduler core;
  std::array<PyPlan, 2> plans;

  explicit PyScheduler(SchedulerConfig config) : core(std::move(config)) {
    for (int i = 0; i < 2; ++i) {
      plans[i].plan = core.plan_buffer(i).get();
      plans[i].page_size = core.config().page_size;
      plans[i].buffer = nb::cast(PlanBuffer{core.plan_buffer(i)});
    }
  }
  PyPlan& next_plan(const lightspeed::DraftInput& drafts) {
    Plan& plan = core.next_plan(drafts);
    return plans[&plan == plans[0].plan ? 0 : 1];
  }
};

using Int32Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt64Array = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using TokenMatrix = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// Disk records found at start-up -> restore_disk_pages(); returns accepted[N] as a numpy bool array.
nb::object restore_disk_pages(Scheduler& s, Int32Array slots, UInt64Array keys, UInt64Array parent_keys,
                              Int32Array depths, TokenMatrix tokens) {
  const size_t n = slots.shape(0);
  const auto page_size = static_cast<size_t>(s.config().page_size);
  if (keys.shape(0) != n || parent_keys.shape(0) != n || depths.shape(0) != n || tokens.shape(0) != n ||
      (n > 0 && tokens.shape(1) != page_size))
    throw nb::value_error(("restore_disk_pages(): expected slots, keys, parent_keys, depths [N] and tokens [N, " +
                           std::to_string(page_size) + "]").c_str());
  std::vector<lightspeed::prefix::DiskRecord> records(n);
  for (size_t i = 0; i < n; ++i)
    records[i] = {slots.data()[i], keys.data()[i], parent_keys.data()[i], depths.data()[i],
                  tokens.data() + i * page_size};
  auto* accepted = new std::vector<uint8_t>(s.restore_disk_pages(records));
  nb::capsule owner(accepted, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, bool, nb::ndim<1>>(reinterpret_cast<bool*>(accepted->data()), {n}, owner));
}

using MutInt32Array = nb::ndarray<int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using MutInt32Matrix = nb::ndarray<int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// A [rows, width] int32 matrix as a span and its width (rows must match).
std::span<const int32_t> as_matrix(nb::handle obj, const char* name, size_t rows, int32_t& width, TokenMatrix& array) {
  if (!nb::try_cast(obj, array, /*convert=*/false) || array.shape(0) != rows)
    throw nb::type_error((std::string(name) + " must be a C-contiguous int32 array [" + std::to_string(rows) +
                          ", width]").c_str());
  width = static_cast<int32_t>(array.shape(1));
  return {array.data(), array.shape(0) * array.shape(1)};
}

// Token ids from an int32 array (zero-copy), an int64 array (checked copy: no silent wrapping),
// or any Python sequence of ints. numpy, torch (CPU) and other DLPack arrays all qualify.
std::span<const int32_t> as_int32(nb::handle obj, const char* name, std::vector<int32_t>& scratch, Int32Array& array) {
  if (nb::try_cast(obj, array, /*convert=*/false)) return {array.data(), array.shape(0)};
  Int64Array wide;
  if (nb::try_cast(obj, wide, /*convert=*/false)) {
    scratch.resize(wide.shape(0));
    for (size_t i = 0; i < scratch.size(); ++i) {
      const int64_t value = wide.data()[i];
      if (value < INT32_MIN || value > INT32_MAX)
        throw nb::value_error((std::string(name) + " holds " + std::to_string(value) + ", outside int32").c_str());
      scratch[i] = static_cast<int32_t>(value);
    }
    return scratch;
  }
  if (!nb::try_cast(obj, scratch))
    throw nb::type_error((std::string(name) + " must be a 1-D integer array or a sequence of ints").c_str());
  return scratch;
}

std::vector<int32_t> int32_vector(nb::handle obj, const char* name) {
  std::vector<int32_t> scratch;
  Int32Array array;
  auto ids = as_int32(obj, name, scratch, array);
  return ids.data() == scratch.data() ? std::move(scratch) : std::vector<int32_t>(ids.begin(), ids.end());
}

// Signature strings must outlive the module: literals, not temporaries.
#define LS_IDS "collections.abc.Sequence[int] | numpy.typing.NDArray[numpy.integer]"

#define LS_ARRAY_SIG(name, type) nb::for_getter(nb::sig("def " name "(self) -> numpy.typing.NDArray[" type "]"))

const char* const kConfigDoc =
    "Scheduler configuration (immutable). Validated on construction; a bad value raises ValueError.";

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "Lightspeed's C++ scheduler: request state machine, paged KV, prefix cache, batching.";

  nb::class_<SchedulerConfig>(m, "SchedulerConfig", kConfigDoc)
      .def(
          "__init__",
          [](SchedulerConfig* self, int32_t page_size, int32_t num_device_pages, int32_t num_host_pages,
             int32_t max_num_seqs, int32_t max_num_batched_tokens, int32_t chunked_prefill_size,
             int32_t max_model_len, std::string policy, bool enable_prefix_cache, int32_t max_num_draft_tokens,
             bool async_copies, int32_t max_write_through_pages, int32_t num_disk_pages,
             int32_t max_disk_write_pages, int32_t num_lookahead_tokens, int32_t num_spare_slots,
             std::string eviction_policy) {
            SchedulerConfig config{page_size,     num_device_pages, num_host_pages,      max_num_seqs,
                                   max_num_batched_tokens, chunked_prefill_size, max_model_len, std::move(policy),
                                   enable_prefix_cache, max_num_draft_tokens, async_copies,
                                   max_write_through_pages, num_disk_pages, max_disk_write_pages,
                                   num_lookahead_tokens, num_spare_slots, std::move(eviction_policy)};
            config.validate();
            new (self) SchedulerConfig(std::move(config));
          },
          nb::kw_only(), "page_size"_a = 16, "num_device_pages"_a = 1024, "num_host_pages"_a = 4096,
          "max_num_seqs"_a = 256, "max_num_batched_tokens"_a = 8192, "chunked_prefill_size"_a = 2048,
          "max_model_len"_a = 32768, "policy"_a = "decode_first", "enable_prefix_cache"_a = true,
          "max_num_draft_tokens"_a = 15, "async_copies"_a = false, "max_write_through_pages"_a = 256,
          "num_disk_pages"_a = 0, "max_disk_write_pages"_a = 64, "num_lookahead_tokens"_a = 0,
          "num_spare_slots"_a = 0, "eviction_policy"_a = "queue")
      .def_ro("page_size", &SchedulerConfig::page_size, "Tokens per KV page.")
      .def_ro("num_device_pages", &SchedulerConfig::num_device_pages,
              "Device KV pool size in pages, padding page 0 included.")
      .def_ro("num_host_pages", &SchedulerConfig::num_host_pages,
              "Host (pinned CPU) KV pool size in pages, padding page 0 included; 0: no host tier.")
      .def_ro("max_num_seqs", &SchedulerConfig::max_num_seqs,
              "Most rows per step, and most running requests once the plan in flight is advanced.")
      .def_ro("num_spare_slots", &SchedulerConfig::num_spare_slots,
              "Request slots beyond max_num_seqs: with a plan in flight, requests it will finish (their "
              "last token is in it) keep their slots while waiting requests start in spare ones.")
      .def_prop_ro("num_slots", &SchedulerConfig::num_slots,
                   "Request slots, max_num_seqs + num_spare_slots: req_slots lie in [0, num_slots).")
      .def_ro("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens, "Most tokens per step.")
      .def_ro("chunked_prefill_size", &SchedulerConfig::chunked_prefill_size,
              "Most prompt tokens one request computes per step.")
      .def_ro("max_model_len", &SchedulerConfig::max_model_len, "Most prompt + output tokens per request.")
      .def_ro("policy", &SchedulerConfig::policy, "'decode_first' (default) or 'prefill_first'.")
      .def_ro("enable_prefix_cache", &SchedulerConfig::enable_prefix_cache,
              "Share KV of common prompt prefixes (device and host tiers).")
      .def_ro("max_num_draft_tokens", &SchedulerConfig::max_num_draft_tokens,
              "Largest num_draft_tokens a request may ask for.")
      .def_ro("async_copies", &SchedulerConfig::async_copies,
              "Copies are acknowledged by copies_done(step_id) when they land, not by advance().")
      .def_ro("max_write_through_pages", &SchedulerConfig::max_write_through_pages,
              "Most prefix pages being written through to host at once (bounds bytes in flight).")
      .def_ro("num_disk_pages", &SchedulerConfig::num_disk_pages,
              "Disk tier size in page slots, slot 0 included (never used); 0: no disk tier. Needs a host tier.")
      .def_ro("max_disk_write_pages", &SchedulerConfig::max_disk_write_pages,
              "Most host pages being written to disk at once (bounds disk write bytes in flight).")
      .def_ro("eviction_policy", &SchedulerConfig::eviction_policy,
              "'queue' (default): LRU, but waiting requests' cached prefixes go last, the next admitted very "
              "last; 'lru': LRU only.")
      .def_ro("num_lookahead_tokens", &SchedulerConfig::num_lookahead_tokens,
              "KV tokens decode rows reserve past their last position (a device draft model writes there).")
      .def("__repr__", [](const SchedulerConfig& c) {
        return "SchedulerConfig(page_size=" + std::to_string(c.page_size) +
               ", num_device_pages=" + std::to_string(c.num_device_pages) +
               ", num_host_pages=" + std::to_string(c.num_host_pages) +
               ", max_num_seqs=" + std::to_string(c.max_num_seqs) +
               ", num_spare_slots=" + std::to_string(c.num_spare_slots) +
               ", max_num_batched_tokens=" + std::to_string(c.max_num_batched_tokens) +
               ", chunked_prefill_size=" + std::to_string(c.chunked_prefill_size) +
               ", max_model_len=" + std::to_string(c.max_model_len) + ", policy='" + c.policy +
               "', enable_prefix_cache=" + (c.enable_prefix_cache ? "True" : "False") +
               ", max_num_draft_tokens=" + std::to_string(c.max_num_draft_tokens) +
               ", async_copies=" + (c.async_copies ? "True" : "False") +
               ", max_write_through_pages=" + std::to_string(c.max_write_through_pages) +
               ", num_disk_pages=" + std::to_string(c.num_disk_pages) +
               ", max_disk_write_pages=" + std::to_string(c.max_disk_write_pages) +
               ", num_lookahead_tokens=" + std::to_string(c.num_lookahead_tokens) +
               ", eviction_policy='" + c.eviction_policy + "')";
      });

  nb::class_<RequestSpec>(m, "RequestSpec", "What a request asks for. Checked by Scheduler.submit().")
      .def(
          "__init__",
          [](RequestSpec* self, std::string rid, nb::handle token_ids, int32_t max_new_tokens, nb::handle eos_token_ids,
             nb::handle stop_token_ids, bool ignore_eos, int32_t priority, int32_t num_draft_tokens,
             int32_t retention) {
            new (self) RequestSpec{std::move(rid),
                                   int32_vector(token_ids, "token_ids"),
                                   max_new_tokens,
                                   int32_vector(eos_token_ids, "eos_token_ids"),
                                   int32_vector(stop_token_ids, "stop_token_ids"),
                                   ignore_eos,
                                   priority,
                                   num_draft_tokens,
                                   retention};
          },
          nb::kw_only(), "rid"_a, "token_ids"_a, "max_new_tokens"_a = 16, "eos_token_ids"_a = nb::tuple(),
          "stop_token_ids"_a = nb::tuple(), "ignore_eos"_a = false, "priority"_a = 0, "num_draft_tokens"_a = 0,
          "retention"_a = 0,
          nb::sig("def __init__(self, *, rid: str, token_ids: " LS_IDS ", max_new_tokens: int = 16, "
                  "eos_token_ids: " LS_IDS " = (), stop_token_ids: " LS_IDS " = (), ignore_eos: bool = False, "
                  "priority: int = 0, num_draft_tokens: int = 0, retention: int = 0) -> None"))
      .def_ro("rid", &RequestSpec::rid, "Caller's id; unique among live requests.")
      .def_ro("token_ids", &RequestSpec::token_ids, "Prompt token ids.")
      .def_ro("max_new_tokens", &RequestSpec::max_new_tokens, "Stop with 'length' after this many outputs.")
      .def_ro("eos_token_ids", &RequestSpec::eos_token_ids, "Stop with 'stop' on these unless ignore_eos.")
      .def_ro("stop_token_ids", &RequestSpec::stop_token_ids, "Stop with 'stop' on these, always.")
      .def_ro("ignore_eos", &RequestSpec::ignore_eos, "Ignore eos_token_ids.")
      .def_ro("priority", &RequestSpec::priority, "Larger is scheduled first and retracted last.")
      .def_ro("retention", &RequestSpec::retention,
              "Extra eviction sweeps the prefix-cache pages of this request survive (a session's hint; 0: LRU).")
      .def_ro("num_draft_tokens", &RequestSpec::num_draft_tokens,
              "Speculative draft tokens per decode step (k; the row has k + 1 query tokens).");

  nb::class_<PlanBuffer>(m, "_PlanBuffer", "Owner of one plan buffer's memory (internal).");

  nb::class_<PyPlan>(m, "Plan",
                     "One step. Arrays are zero-copy views valid until the next_plan() call after next "
                     "(two buffers alternate). Rows: decodes first, then prefills. Before the forward, "
                     "run write_back copies (device->host), then load_back copies (host->device); beside "
                     "them, on the disk tier's workers, disk_write (host->disk) and disk_read (disk->host).")
      .def_prop_ro("step_id", [](const PyPlan& p) { return p.plan->step_id; }, "Plan sequence number.")
      .def_prop_ro("num_prefills", [](const PyPlan& p) { return p.plan->num_prefills; },
                   "Prefill rows (after the decode rows).")
      .def_prop_ro("num_decodes", [](const PyPlan& p) { return p.plan->num_decodes; },
                   "Decode rows (rows [0, num_decodes)).")
      .def_prop_ro("num_decode_tokens", [](const PyPlan& p) { return p.plan->num_decode_tokens; },
                   "Tokens of the decode rows (a prefix of T).")
      .def_prop_ro("max_query_len", [](const PyPlan& p) { return p.plan->max_query_len; },
                   "Longest row in query tokens.")
      .def_prop_ro("num_reqs", [](const PyPlan& p) { return p.plan->num_rows; }, "B: rows in this step.")
      .def_prop_ro("num_tokens", [](const PyPlan& p) { return p.plan->num_tokens; }, "T: query tokens.")
      .def_prop_ro("num_samples", [](const PyPlan& p) { return p.plan->num_samples; }, "S: sampled positions.")
      .def_prop_ro("in_flight", [](const PyPlan& p) { return p.plan->in_flight; },
                   "Returned by next_plan() and not yet advanced.")
      .def_prop_ro("has_copies", [](const PyPlan& p) { return p.plan->has_copies; },
                   "The plan has copies to acknowledge (with async_copies: call copies_done(step_id) "
                   "once they have landed).")
      .def_prop_ro("has_disk_ops", [](const PyPlan& p) { return p.plan->has_disk_ops; },
                   "The plan has disk reads or writes to acknowledge (with async_copies: call "
                   "disk_done(step_id, ...) once they are done).")
      .def_prop_ro("forward_waits_for_copies", [](const PyPlan& p) { return p.plan->forward_waits_for_copies; },
                   "The forward may overwrite device pages this plan's write_back reads (retraction): "
                   "it must start after the copies. Otherwise copies may run beside it.")
      .def_prop_ro("req_ids", [](PyPlan& p) { return p.view(kReqIds, p.plan->req_ids.data(), p.plan->num_rows); },
                   LS_ARRAY_SIG("req_ids", "numpy.int64"), "int64[B]: ids returned by submit().")
      .def_prop_ro("req_slots",
                   [](PyPlan& p) { return p.view(kReqSlots, p.plan->req_slots.data(), p.plan->num_rows); },
                   LS_ARRAY_SIG("req_slots", "numpy.int32"),
                   "int32[B]: stable row in [0, num_slots) per request, for per-request GPU state.")
      .def_prop_ro("input_ids",
                   [](PyPlan& p) { return p.view(kInputIds, p.plan->input_ids.data(), p.plan->num_tokens); },
                   LS_ARRAY_SIG("input_ids", "numpy.int32"),
                   "int32[T]: input tokens; at a draft slot the drafter's token (0 when none was given); "
                   "0 where deferred_input_mask.")
      .def_prop_ro("positions",
                   [](PyPlan& p) { return p.view(kPositions, p.plan->positions.data(), p.plan->num_tokens); },
                   LS_ARRAY_SIG("positions", "numpy.int64"), "int64[T]: position of each token in its sequence.")
      .def_prop_ro("query_start_loc",
                   [](PyPlan& p) {
                     return p.view(kQueryStartLoc, p.plan->query_start_loc.data(), p.plan->num_rows + 1);
                   },
                   LS_ARRAY_SIG("query_start_loc", "numpy.int32"),
                   "int32[B+1]: row b's tokens are [query_start_loc[b], query_start_loc[b+1]).")
      .def_prop_ro("seq_lens",
                   [](PyPlan& p) { return p.view(kSeqLens, p.plan->seq_lens.data(), p.plan->num_rows); },
                   LS_ARRAY_SIG("seq_lens", "numpy.int32"), "int32[B]: tokens in KV after this step, new ones included.")
      .def_prop_ro("cached_lens",
                   [](PyPlan& p) { return p.view(kCachedLens, p.plan->cached_lens.data(), p.plan->num_rows); },
                   LS_ARRAY_SIG("cached_lens", "numpy.int32"), "int32[B]: tokens in KV before this step.")
      .def_prop_ro("page_table",
                   [](PyPlan& p) {
                     return p.view(kPageTable, p.plan->page_table.data(), p.plan->num_rows, p.plan->pages_per_row);
                   },
                   LS_ARRAY_SIG("page_table", "numpy.int32"),
                   "int32[B, P]: KV pages per row, padded with page 0 (P: the widest row).")
      .def_prop_ro("slot_mapping",
                   [](PyPlan& p) { return p.view(kSlotMapping, p.plan->slot_mapping.data(), p.plan->num_tokens); },
                   LS_ARRAY_SIG("slot_mapping", "numpy.int64"),
                   "int64[T]: KV slot of each token, page * page_size + offset.")
      .def_prop_ro("logits_indices",
                   [](PyPlan& p) {
                     return p.view(kLogitsIndices, p.plan->logits_indices.data(), p.plan->num_samples);
                   },
                   LS_ARRAY_SIG("logits_indices", "numpy.int32"), "int32[S]: flat token indices that are sampled.")
      .def_prop_ro("sample_batch_rows",
                   [](PyPlan& p) {
                     return p.view(kSampleBatchRows, p.plan->sample_batch_rows.data(), p.plan->num_samples);
                   },
                   LS_ARRAY_SIG("sample_batch_rows", "numpy.int32"), "int32[S]: batch row of each sampled position.")
      .def_prop_ro("deferred_input_mask",
                   [](PyPlan& p) {
                     return p.view(kDeferredMask, reinterpret_cast<bool*>(p.plan->deferred_input_mask.data()),
                                   p.plan->num_tokens);
                   },
                   LS_ARRAY_SIG("deferred_input_mask", "numpy.bool_"),
                   "bool[T]: input is the previous plan's sample, to be filled on the GPU.")
      .def_prop_ro("deferred_src_index",
                   [](PyPlan& p) {
                     return p.view(kDeferredSrc, p.plan->deferred_src_index.data(), p.plan->num_tokens);
                   },
                   LS_ARRAY_SIG("deferred_src_index", "numpy.int32"),
                   "int32[T]: index into the previous plan's sampled tokens, -1 elsewhere.")
      .def_prop_ro("load_back",
                   [](PyPlan& p) {
                     return p.view(kLoadBack, p.plan->load_back.data(), p.plan->load_back.size() / 2, 2);
                   },
                   LS_ARRAY_SIG("load_back", "numpy.int32"),
                   "int32[N, 2]: (host page, device page) copies, after every earlier plan's forward.")
      .def_prop_ro("appended_counts",
                   [](PyPlan& p) {
                     return p.view(kAppendedCounts, p.plan->appended_counts.data(), p.plan->num_rows);
                   },
                   LS_ARRAY_SIG("appended_counts", "numpy.int32"),
                   "int32[B]: output tokens advance() appended per row (its first ones; 0 for a row void "
                   "because its request finished or was aborted). Valid after advance(plan).")
      .def_prop_ro("write_back",
                   [](PyPlan& p) {
                     return p.view(kWriteBack, p.plan->write_back.data(), p.plan->write_back.size() / 2, 2);
                   },
                   LS_ARRAY_SIG("write_back", "numpy.int32"),
                   "int32[M, 2]: (device page, host page) copies, after every earlier plan's forward and "
                   "before load_back.")
      .def_prop_ro("disk_write",
                   [](PyPlan& p) {
                     return p.view(kDiskWrite, p.plan->disk_write.data(), p.plan->disk_write.size() / 2, 2);
                   },
                   LS_ARRAY_SIG("disk_write", "numpy.int32"),
                   "int32[K, 2]: (host page, disk slot) writes; the host pages hold landed copies.")
      .def_prop_ro("disk_write_keys",
                   [](PyPlan& p) {
                     return p.view(kDiskWriteKeys, p.plan->disk_write_keys.data(), p.plan->disk_write_keys.size() / 3, 3);
                   },
                   LS_ARRAY_SIG("disk_write_keys", "numpy.uint64"),
                   "uint64[K, 3]: (page key, parent's key, depth) of each write, stored with the record.")
      .def_prop_ro("disk_write_tokens",
                   [](PyPlan& p) {
                     return p.view(kDiskWriteTokens, p.plan->disk_write_tokens.data(), p.plan->disk_write.size() / 2,
                                   static_cast<size_t>(p.page_size));
                   },
                   LS_ARRAY_SIG("disk_write_tokens", "numpy.int32"),
                   "int32[K, page_size]: the tokens of each written page, stored with the record.")
      .def_prop_ro("disk_read",
                   [](PyPlan& p) {
                     return p.view(kDiskRead, p.plan->disk_read.data(), p.plan->disk_read.size() / 2, 2);
                   },
                   LS_ARRAY_SIG("disk_read", "numpy.int32"),
                   "int32[R, 2]: (disk slot, host page) reads into host pages of the request's own.")
      .def_prop_ro("disk_read_keys",
                   [](PyPlan& p) { return p.view(kDiskReadKeys, p.plan->disk_read_keys.data(), p.plan->disk_read_keys.size()); },
                   LS_ARRAY_SIG("disk_read_keys", "numpy.uint64"),
                   "uint64[R]: the page key each record read must carry (else the read fails).")
      .def_prop_ro("disk_read_tokens",
                   [](PyPlan& p) {
                     return p.view(kDiskReadTokens, p.plan->disk_read_tokens.data(), p.plan->disk_read.size() / 2,
                                   static_cast<size_t>(p.page_size));
                   },
                   LS_ARRAY_SIG("disk_read_tokens", "numpy.int32"),
                   "int32[R, page_size]: the tokens each record read must carry (else the read fails).");

  nb::class_<PyScheduler>(m, "Scheduler", "Plans each step's batch and owns every KV page. Not thread-safe.")
      .def(nb::init<SchedulerConfig>(), "config"_a)
      .def_prop_ro("config", [](const PyScheduler& s) { return s.core.config(); }, "The configuration (a copy).")
      .def("submit", [](PyScheduler& s, const RequestSpec& spec) { return s.core.submit(spec); }, "spec"_a,
           "Queues a request and returns its id (int). ValueError on bad input; nothing changes then.")
      .def("abort", [](PyScheduler& s, int64_t req_id) { s.core.abort(req_id); }, "req_id"_a,
           "Frees everything the request holds now. The next advance() lists it as (req_id, 'abort'). "
           "ValueError if the id is unknown or already finished.")
      .def(
          "next_plan",
          [](PyScheduler& s, nb::handle num_draft_tokens, nb::handle draft_token_ids) -> PyPlan& {
            lightspeed::DraftInput drafts;
            std::vector<int32_t> counts_scratch;
            Int32Array counts_array;
            TokenMatrix tokens_array;
            if (!num_draft_tokens.is_none())
              drafts.counts = as_int32(num_draft_tokens, "num_draft_tokens", counts_scratch, counts_array);
            if (!draft_token_ids.is_none()) {
              if (!nb::try_cast(draft_token_ids, tokens_array, /*convert=*/false))
                throw nb::type_error("draft_token_ids must be a C-contiguous int32 array [num_slots, width]");
              drafts.tokens = {tokens_array.data(), tokens_array.shape(0) * tokens_array.shape(1)};
              drafts.width = static_cast<int32_t>(tokens_array.shape(1));
            }
            return s.next_plan(drafts);
          },
          "num_draft_tokens"_a = nb::none(), "draft_token_ids"_a = nb::none(), nb::rv_policy::reference_internal,
          nb::sig("def next_plan(self, num_draft_tokens: " LS_IDS " | None = None, draft_token_ids: "
                  "numpy.typing.NDArray[numpy.int32] | None = None) -> Plan"),
          "Builds the next step. May be called once while one plan is in flight (overlap). "
          "num_draft_tokens: int32[num_slots], draft tokens wanted this step per slot (default: "
          "each request's RequestSpec.num_draft_tokens); draft_token_ids: int32[num_slots, width], "
          "the drafts by slot, copied into input_ids at each decode row's draft slots (default: 0 "
          "there, for a drafter that fills them on the device). ValueError on malformed drafts.")
      .def(
          "advance",
          [](PyScheduler& s, PyPlan& plan, nb::handle sampled_token_ids, nb::handle accepted_counts) {
            std::vector<int32_t> sampled_scratch, accepted_scratch;
            Int32Array sampled_array, accepted_array;
            auto sampled = as_int32(sampled_token_ids, "sampled_token_ids", sampled_scratch, sampled_array);
            std::span<const int32_t> accepted;
            if (!accepted_counts.is_none())
              accepted = as_int32(accepted_counts, "accepted_counts", accepted_scratch, accepted_array);
            const auto& finished = s.core.advance(*plan.plan, sampled, accepted);
            nb::list result;
            for (const auto& f : finished)
              result.append(nb::make_tuple(f.req_id, lightspeed::fsm::reason_name(f.reason)));
            return result;
          },
          "plan"_a, "sampled_token_ids"_a, "accepted_counts"_a = nb::none(),
          nb::sig("def advance(self, plan: Plan, sampled_token_ids: " LS_IDS ", accepted_counts: " LS_IDS
                  " | None = None) -> list[tuple[int, str]]"),
          "Consumes the oldest in-flight plan: int32[S] samples (and, with speculative rows, "
          "accepted_counts int32[num_decodes] in [1, k+1]). Acknowledges its copies unless "
          "async_copies. Returns [(req_id, reason)] with reason in {'stop', 'length', 'abort'}.")
      .def("copies_done", [](PyScheduler& s, int64_t step_id) { s.core.copies_done(step_id); }, "step_id"_a,
           "With async_copies: the copies of plan step_id have landed (any order). ValueError when that "
           "plan has none unacknowledged.")
      .def(
          "disk_done",
          [](PyScheduler& s, int64_t step_id, nb::handle failed_writes, nb::handle failed_reads) {
            std::vector<int32_t> writes_scratch, reads_scratch;
            Int32Array writes_array, reads_array;
            auto writes = as_int32(failed_writes, "failed_writes", writes_scratch, writes_array);
            auto reads = as_int32(failed_reads, "failed_reads", reads_scratch, reads_array);
            s.core.disk_done(step_id, writes, reads);
          },
          "step_id"_a, "failed_writes"_a = nb::tuple(), "failed_reads"_a = nb::tuple(),
          nb::sig("def disk_done(self, step_id: int, failed_writes: " LS_IDS " = (), failed_reads: " LS_IDS
                  " = ()) -> None"),
          "With async_copies: the disk ops of plan step_id are done (any order with copies_done). "
          "failed_writes / failed_reads: rows of its disk_write / disk_read that did not happen or whose "
          "record did not verify. ValueError when that plan has none unacknowledged or a row is out of range.")
      .def("stop_disk_writes", [](PyScheduler& s) { s.core.stop_disk_writes(); },
           "The disk takes no more writes (full, or failing): none are planned from now on; reads go on.")
      .def(
          "restore_disk_pages",
          [](PyScheduler& s, Int32Array slots, UInt64Array keys, UInt64Array parent_keys, Int32Array depths,
             TokenMatrix tokens) { return restore_disk_pages(s.core, slots, keys, parent_keys, depths, tokens); },
          "slots"_a, "keys"_a, "parent_keys"_a, "depths"_a, "tokens"_a,
          nb::sig("def restore_disk_pages(self, slots: numpy.typing.NDArray[numpy.int32], keys: "
                  "numpy.typing.NDArray[numpy.uint64], parent_keys: numpy.typing.NDArray[numpy.uint64], depths: "
                  "numpy.typing.NDArray[numpy.int32], tokens: numpy.typing.NDArray[numpy.int32]) -> "
                  "numpy.typing.NDArray[numpy.bool_]"),
          "Before the first plan: disk records found at start-up (oldest first; tokens [N, page_size]) "
          "become disk-only prefix-cache pages. A record whose parent is not restored, whose key does not "
          "chain from its parent's and its tokens, or whose slot is taken or out of range is rejected. "
          "Returns accepted[N] (bool). ValueError after the first plan or without a disk tier.")
      .def("has_pending_copies", [](const PyScheduler& s) { return s.core.has_pending_copies(); },
           "Copies in flight, or prefix pages queued for write-through to host or disk: keep stepping "
           "until False.")
      .def(
          "request_stats",
          [](const PyScheduler& s, int64_t req_id) {
            const auto st = s.core.request_stats(req_id);
            nb::dict d;
            d["num_prompt_tokens"] = st.num_prompt_tokens;
            d["num_cached_tokens"] = st.num_cached_tokens;
            d["num_cached_device_tokens"] = st.num_cached_device_tokens;
            d["num_cached_host_tokens"] = st.num_cached_host_tokens;
            d["num_cached_disk_tokens"] = st.num_cached_disk_tokens;
            d["num_output_tokens"] = st.num_output_tokens;
            d["state"] = st.state;
            return d;
          },
          "req_id"_a, "Per-request counters (num_cached_tokens also per tier: device, host, disk); available "
          "until the advance() after the one reporting it finished.")
      .def(
          "output_token_ids",
          [](const PyScheduler& s, int64_t req_id) {
            auto ids = s.core.output_token_ids(req_id);
            return std::vector<int32_t>(ids.begin(), ids.end());
          },
          "req_id"_a, "Accepted output tokens so far (a copy).")
      .def(
          "stats",
          [](const PyScheduler& s) {
            const auto st = s.core.stats();
            nb::dict d;
            d["free_device_pages"] = st.free_device_pages;
            d["free_host_pages"] = st.free_host_pages;
            d["num_device_pages"] = st.num_device_pages;
            d["num_host_pages"] = st.num_host_pages;
            d["num_waiting"] = st.num_waiting;
            d["num_running"] = st.num_running;
            d["num_retracted"] = st.num_retracted;
            d["num_loading"] = st.num_loading;
            d["num_writing_back"] = st.num_writing_back;
            d["write_through_queued"] = st.write_through_queued;
            d["num_copy_batches"] = st.num_copy_batches;
            d["cached_device_pages"] = st.cached_device_pages;
            d["cached_host_pages"] = st.cached_host_pages;
            d["unreferenced_cached_device_pages"] = st.unreferenced_cached_device_pages;
            d["num_in_flight_plans"] = st.num_in_flight_plans;
            d["prefix_hit_tokens"] = st.prefix_hit_tokens;
            d["prefix_query_tokens"] = st.prefix_query_tokens;
            d["num_retractions"] = st.num_retractions;
            d["num_steps"] = st.num_steps;
            d["free_disk_pages"] = st.free_disk_pages;
            d["num_disk_pages"] = st.num_disk_pages;
            d["cached_disk_pages"] = st.cached_disk_pages;
            d["num_disk_writing"] = st.num_disk_writing;
            d["disk_write_queued"] = st.disk_write_queued;
            d["device_hit_tokens"] = st.device_hit_tokens;
            d["host_hit_tokens"] = st.host_hit_tokens;
            d["disk_hit_tokens"] = st.disk_hit_tokens;
            d["disk_pages_read"] = st.disk_pages_read;
            d["disk_pages_written"] = st.disk_pages_written;
            d["disk_read_failures"] = st.disk_read_failures;
            d["disk_write_failures"] = st.disk_write_failures;
            d["disk_writes_stopped"] = st.disk_writes_stopped;
            return d;
          },
          "Counters: pages, queue lengths, prefix-cache hits (in all and per tier), retractions, disk I/O.")
      .def("has_unfinished", [](const PyScheduler& s) { return s.core.has_unfinished(); },
           "True while a request is live or an abort is yet to be reported by advance().")
      .def_prop_ro("num_unfinished", [](const PyScheduler& s) { return s.core.num_unfinished(); }, "Live requests plus unreported aborts.")
      .def("check_invariants", [](const PyScheduler& s) { s.core.check_invariants(); },
           "Recounts every page reference; raises RuntimeError on a broken invariant (tests, O(pages)).");

  nb::class_<lightspeed::draft::DraftProposer>(
      m, "DraftProposer",
      "CPU drafter for speculative decoding: prompt lookup ('ngram') over a request's own tokens, or "
      "suffix matching ('suffix') that also searches the outputs of recent finished requests of the "
      "same group (conversation). Per-slot state; draft length adapts to acceptance. Not thread-safe.")
      .def(
          "__init__",
          [](lightspeed::draft::DraftProposer* self, std::string method, int32_t max_num_seqs,
             int32_t num_speculative_tokens, int32_t min_match, int32_t max_match, int32_t max_cached_requests,
             double max_spec_factor, double min_token_prob) {
            new (self) lightspeed::draft::DraftProposer(lightspeed::draft::ProposerConfig{
                std::move(method), max_num_seqs, num_speculative_tokens, min_match, max_match, max_cached_requests,
                max_spec_factor, min_token_prob});
          },
          nb::kw_only(), "method"_a = "ngram", "max_num_seqs"_a = 256, "num_speculative_tokens"_a = 3,
          "min_match"_a = 3, "max_match"_a = 8, "max_cached_requests"_a = 1000, "max_spec_factor"_a = 1.0,
          "min_token_prob"_a = 0.1)
      .def(
          "start",
          [](lightspeed::draft::DraftProposer& p, int32_t slot, nb::handle token_ids, int32_t num_prompt_tokens,
             int64_t group) { p.start(slot, int32_vector(token_ids, "token_ids"), num_prompt_tokens, group); },
          "slot"_a, "token_ids"_a, "num_prompt_tokens"_a, "group"_a = -1,
          nb::sig("def start(self, slot: int, token_ids: " LS_IDS ", num_prompt_tokens: int, group: int = -1) -> None"),
          "Binds a slot to a request: its tokens so far (prompt, then outputs), how many are prompt, its "
          "group (-1: none).")
      .def(
          "commit",
          [](lightspeed::draft::DraftProposer& p, nb::handle slots, nb::handle token_ids) {
            std::vector<int32_t> a, b;
            Int32Array x, y;
            p.commit(as_int32(slots, "slots", a, x), as_int32(token_ids, "token_ids", b, y));
          },
          "slots"_a, "token_ids"_a,
          nb::sig("def commit(self, slots: " LS_IDS ", token_ids: " LS_IDS ") -> None"),
          "Appends accepted tokens: token_ids[i] to slots[i], in order.")
      .def(
          "observe",
          [](lightspeed::draft::DraftProposer& p, nb::handle slots, nb::handle drafted, nb::handle accepted) {
            std::vector<int32_t> a, b, c;
            Int32Array x, y, z;
            p.observe(as_int32(slots, "slots", a, x), as_int32(drafted, "drafted", b, y),
                      as_int32(accepted, "accepted", c, z));
          },
          "slots"_a, "drafted"_a, "accepted"_a,
          nb::sig("def observe(self, slots: " LS_IDS ", drafted: " LS_IDS ", accepted: " LS_IDS ") -> None"),
          "Acceptance history: slots[i] proposed drafted[i] drafts and accepted[i] of them.")
      .def("release", &lightspeed::draft::DraftProposer::release, "slot"_a,
           "The slot's request finished; with 'suffix' its outputs join its group's cached requests.")
      .def(
          "propose",
          [](const lightspeed::draft::DraftProposer& p, nb::handle slots, nb::handle extra, nb::handle pending_counts,
             nb::handle pending_tokens, MutInt32Matrix out_tokens, MutInt32Array out_counts) {
            std::vector<int32_t> a, b, c;
            Int32Array x, y, z;
            TokenMatrix pending_array;
            auto slot_ids = as_int32(slots, "slots", a, x);
            int32_t pending_width = 0;
            auto pending = as_matrix(pending_tokens, "pending_tokens", slot_ids.size(), pending_width, pending_array);
            if (out_tokens.shape(0) != slot_ids.size() || out_counts.shape(0) != slot_ids.size())
              throw nb::value_error("out_tokens and out_counts need one row per slot");
            p.propose(slot_ids, as_int32(extra, "extra", b, y), as_int32(pending_counts, "pending_counts", c, z),
                      pending, pending_width, {out_tokens.data(), out_tokens.shape(0) * out_tokens.shape(1)},
                      static_cast<int32_t>(out_tokens.shape(1)), {out_counts.data(), out_counts.shape(0)});
          },
          "slots"_a, "extra"_a, "pending_counts"_a, "pending_tokens"_a, "out_tokens"_a, "out_counts"_a,
          nb::sig("def propose(self, slots: " LS_IDS ", extra: " LS_IDS ", pending_counts: " LS_IDS
                  ", pending_tokens: numpy.typing.NDArray[numpy.int32], out_tokens: numpy.typing.NDArray[numpy.int32], "
                  "out_counts: numpy.typing.NDArray[numpy.int32]) -> None"),
          "For each slots[i]: a continuation of its tokens followed by its first pending_counts[i] "
          "pending_tokens (drafts of its row in flight), at most its draft length + extra[i] tokens "
          "(extra 1: the first stands for an in-flight sample). Fills out_tokens[i, :n] and out_counts[i] = n.")
      .def("draft_length", &lightspeed::draft::DraftProposer::draft_length, "slot"_a,
           "The slot's current draft length (adapted to its acceptance).")
      .def("backoff_remaining", &lightspeed::draft::DraftProposer::backoff_remaining, "slot"_a,
           "Committed tokens the slot waits before it drafts again after drafts that kept missing (0: it drafts).")
      .def_prop_ro("num_cached_requests", &lightspeed::draft::DraftProposer::num_cached_requests,
                   "Finished requests kept for suffix matching.");
}
