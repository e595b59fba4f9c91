// Python bindings (nanobind): the only file that knows about Python.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "config.h"
#include "scheduler.h"

namespace nb = nanobind;
using namespace nb::literals;
using lightspeed::Plan;
using lightspeed::RequestSpec;
using lightspeed::Scheduler;
using lightspeed::SchedulerConfig;

namespace {

// A zero-copy numpy view of a plan buffer; the Plan's Python object is the owner, so the view
// keeps the scheduler alive. The data is valid until the buffer is reused (see Scheduler docs).
template <class T>
nb::ndarray<nb::numpy, T> view(Plan& plan, T* data, std::initializer_list<size_t> shape) {
  return nb::ndarray<nb::numpy, T>(data, shape, nb::find(&plan));
}

// Accepts a numpy/DLPack int array (any int dtype is converted) or a Python sequence of ints.
std::span<const int32_t> as_int32(nb::handle obj, const char* name, std::vector<int32_t>& scratch) {
  using Array = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  Array array;
  if (nb::try_cast(obj, array, /*convert=*/false) || nb::try_cast(obj, array, /*convert=*/true))
    return {array.data(), array.shape(0)};
  // The array may be a temporary conversion: copy so the span outlives it.
  if (!nb::try_cast(obj, scratch))
    throw nb::type_error((std::string(name) + " must be a 1-D int32 array or a sequence of ints").c_str());
  return scratch;
}

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
             int32_t max_model_len, std::string policy, bool enable_prefix_cache, int32_t max_num_draft_tokens) {
            SchedulerConfig config{page_size,     num_device_pages, num_host_pages,      max_num_seqs,
                                   max_num_batched_tokens, chunked_prefill_size, max_model_len, std::move(policy),
                                   enable_prefix_cache, max_num_draft_tokens};
            config.validate();
            new (self) SchedulerConfig(std::move(config));
          },
          nb::kw_only(), "page_size"_a = 16, "num_device_pages"_a = 1024, "num_host_pages"_a = 4096,
          "max_num_seqs"_a = 256, "max_num_batched_tokens"_a = 8192, "chunked_prefill_size"_a = 2048,
          "max_model_len"_a = 32768, "policy"_a = "decode_first", "enable_prefix_cache"_a = true,
          "max_num_draft_tokens"_a = 15)
      .def_ro("page_size", &SchedulerConfig::page_size, "Tokens per KV page.")
      .def_ro("num_device_pages", &SchedulerConfig::num_device_pages,
              "Device KV pool size in pages, padding page 0 included.")
      .def_ro("num_host_pages", &SchedulerConfig::num_host_pages,
              "Host (pinned CPU) KV pool size in pages, padding page 0 included.")
      .def_ro("max_num_seqs", &SchedulerConfig::max_num_seqs,
              "Most rows per step; also the number of request slots (req_slots in [0, max_num_seqs)).")
      .def_ro("max_num_batched_tokens", &SchedulerConfig::max_num_batched_tokens, "Most tokens per step.")
      .def_ro("chunked_prefill_size", &SchedulerConfig::chunked_prefill_size,
              "Most prompt tokens one request computes per step.")
      .def_ro("max_model_len", &SchedulerConfig::max_model_len, "Most prompt + output tokens per request.")
      .def_ro("policy", &SchedulerConfig::policy, "'decode_first' (default) or 'prefill_first'.")
      .def_ro("enable_prefix_cache", &SchedulerConfig::enable_prefix_cache,
              "Share KV of common prompt prefixes (device and host tiers).")
      .def_ro("max_num_draft_tokens", &SchedulerConfig::max_num_draft_tokens,
              "Largest num_draft_tokens a request may ask for.")
      .def("__repr__", [](const SchedulerConfig& c) {
        return "SchedulerConfig(page_size=" + std::to_string(c.page_size) +
               ", num_device_pages=" + std::to_string(c.num_device_pages) +
               ", num_host_pages=" + std::to_string(c.num_host_pages) +
               ", max_num_seqs=" + std::to_string(c.max_num_seqs) +
               ", max_num_batched_tokens=" + std::to_string(c.max_num_batched_tokens) +
               ", chunked_prefill_size=" + std::to_string(c.chunked_prefill_size) +
               ", max_model_len=" + std::to_string(c.max_model_len) + ", policy='" + c.policy +
               "', enable_prefix_cache=" + (c.enable_prefix_cache ? "True" : "False") +
               ", max_num_draft_tokens=" + std::to_string(c.max_num_draft_tokens) + ")";
      });

  nb::class_<RequestSpec>(m, "RequestSpec", "What a request asks for. Checked by Scheduler.submit().")
      .def(
          "__init__",
          [](RequestSpec* self, std::string rid, std::vector<int32_t> token_ids, int32_t max_new_tokens,
             std::vector<int32_t> eos_token_ids, std::vector<int32_t> stop_token_ids, bool ignore_eos,
             int32_t priority, int32_t num_draft_tokens) {
            new (self) RequestSpec{std::move(rid),  std::move(token_ids), max_new_tokens, std::move(eos_token_ids),
                                   std::move(stop_token_ids), ignore_eos, priority, num_draft_tokens};
          },
          nb::kw_only(), "rid"_a, "token_ids"_a, "max_new_tokens"_a = 16,
          "eos_token_ids"_a = std::vector<int32_t>{}, "stop_token_ids"_a = std::vector<int32_t>{},
          "ignore_eos"_a = false, "priority"_a = 0, "num_draft_tokens"_a = 0)
      .def_ro("rid", &RequestSpec::rid, "Caller's id; unique among live requests.")
      .def_ro("token_ids", &RequestSpec::token_ids, "Prompt token ids.")
      .def_ro("max_new_tokens", &RequestSpec::max_new_tokens, "Stop with 'length' after this many outputs.")
      .def_ro("eos_token_ids", &RequestSpec::eos_token_ids, "Stop with 'stop' on these unless ignore_eos.")
      .def_ro("stop_token_ids", &RequestSpec::stop_token_ids, "Stop with 'stop' on these, always.")
      .def_ro("ignore_eos", &RequestSpec::ignore_eos, "Ignore eos_token_ids.")
      .def_ro("priority", &RequestSpec::priority, "Larger is scheduled first and retracted last.")
      .def_ro("num_draft_tokens", &RequestSpec::num_draft_tokens,
              "Speculative draft tokens per decode step (k; the row has k + 1 query tokens).");

  nb::class_<Plan>(m, "Plan",
                   "One step. Arrays are zero-copy views valid until the next_plan() call after next "
                   "(two buffers alternate). Rows: decodes first, then prefills. Before the forward, "
                   "run write_back copies (device->host), then load_back copies (host->device).")
      .def_ro("step_id", &Plan::step_id, "Plan sequence number.")
      .def_ro("num_prefills", &Plan::num_prefills, "Prefill rows (after the decode rows).")
      .def_ro("num_decodes", &Plan::num_decodes, "Decode rows (rows [0, num_decodes)).")
      .def_ro("num_decode_tokens", &Plan::num_decode_tokens, "Tokens of the decode rows (a prefix of T).")
      .def_ro("max_query_len", &Plan::max_query_len, "Longest row in query tokens.")
      .def_ro("num_reqs", &Plan::num_rows, "B: rows in this step.")
      .def_ro("num_tokens", &Plan::num_tokens, "T: query tokens in this step.")
      .def_ro("num_samples", &Plan::num_samples, "S: sampled positions in this step.")
      .def_ro("in_flight", &Plan::in_flight, "Returned by next_plan() and not yet advanced.")
      .def_prop_ro("req_ids", [](Plan& p) { return view(p, p.req_ids.data(), {size_t(p.num_rows)}); },
                   "int64[B]: ids returned by submit().")
      .def_prop_ro("req_slots", [](Plan& p) { return view(p, p.req_slots.data(), {size_t(p.num_rows)}); },
                   "int32[B]: stable row in [0, max_num_seqs) per request, for per-request GPU state.")
      .def_prop_ro("input_ids", [](Plan& p) { return view(p, p.input_ids.data(), {size_t(p.num_tokens)}); },
                   "int32[T]: input tokens; 0 where deferred_input_mask or a draft slot.")
      .def_prop_ro("positions", [](Plan& p) { return view(p, p.positions.data(), {size_t(p.num_tokens)}); },
                   "int64[T]: position of each token in its sequence.")
      .def_prop_ro("query_start_loc",
                   [](Plan& p) { return view(p, p.query_start_loc.data(), {size_t(p.num_rows) + 1}); },
                   "int32[B+1]: row b's tokens are [query_start_loc[b], query_start_loc[b+1]).")
      .def_prop_ro("seq_lens", [](Plan& p) { return view(p, p.seq_lens.data(), {size_t(p.num_rows)}); },
                   "int32[B]: tokens in KV after this step, new ones included.")
      .def_prop_ro("cached_lens", [](Plan& p) { return view(p, p.cached_lens.data(), {size_t(p.num_rows)}); },
                   "int32[B]: tokens in KV before this step.")
      .def_prop_ro("page_table",
                   [](Plan& p) {
                     return view(p, p.page_table.data(), {size_t(p.num_rows), size_t(p.pages_per_row)});
                   },
                   "int32[B, P]: KV pages per row, padded with page 0.")
      .def_prop_ro("slot_mapping", [](Plan& p) { return view(p, p.slot_mapping.data(), {size_t(p.num_tokens)}); },
                   "int64[T]: KV slot of each token, page * page_size + offset.")
      .def_prop_ro("logits_indices",
                   [](Plan& p) { return view(p, p.logits_indices.data(), {size_t(p.num_samples)}); },
                   "int32[S]: flat token indices that are sampled.")
      .def_prop_ro("sample_batch_rows",
                   [](Plan& p) { return view(p, p.sample_batch_rows.data(), {size_t(p.num_samples)}); },
                   "int32[S]: batch row of each sampled position.")
      .def_prop_ro("deferred_input_mask",
                   [](Plan& p) {
                     return view(p, reinterpret_cast<bool*>(p.deferred_input_mask.data()), {size_t(p.num_tokens)});
                   },
                   "bool[T]: input is the previous plan's sample, to be filled on the GPU.")
      .def_prop_ro("deferred_src_index",
                   [](Plan& p) { return view(p, p.deferred_src_index.data(), {size_t(p.num_tokens)}); },
                   "int32[T]: index into the previous plan's sampled tokens, -1 elsewhere.")
      .def_prop_ro("load_back",
                   [](Plan& p) { return view(p, p.load_back.data(), {p.load_back.size() / 2, 2}); },
                   "int32[N, 2]: (host page, device page) copies to run before the forward.")
      .def_prop_ro("write_back",
                   [](Plan& p) { return view(p, p.write_back.data(), {p.write_back.size() / 2, 2}); },
                   "int32[M, 2]: (device page, host page) copies to run before load_back and the forward.");

  nb::class_<Scheduler>(m, "Scheduler", "Plans each step's batch and owns every KV page. Not thread-safe.")
      .def(nb::init<SchedulerConfig>(), "config"_a)
      .def_prop_ro("config", &Scheduler::config, nb::rv_policy::copy, "The configuration (a copy).")
      .def("submit", &Scheduler::submit, "spec"_a,
           "Queues a request and returns its id (int). ValueError on bad input; nothing changes then.")
      .def("abort", &Scheduler::abort, "req_id"_a,
           "Frees everything the request holds now. The next advance() lists it as (req_id, 'abort'). "
           "ValueError if the id is unknown or already finished.")
      .def("next_plan", &Scheduler::next_plan, nb::rv_policy::reference_internal,
           "Builds the next step. May be called once while one plan is in flight (overlap).")
      .def(
          "advance",
          [](Scheduler& s, Plan& plan, nb::handle sampled_token_ids, nb::handle accepted_counts) {
            std::vector<int32_t> sampled_scratch, accepted_scratch;
            auto sampled = as_int32(sampled_token_ids, "sampled_token_ids", sampled_scratch);
            std::span<const int32_t> accepted;
            if (!accepted_counts.is_none()) accepted = as_int32(accepted_counts, "accepted_counts", accepted_scratch);
            const auto& finished = s.advance(plan, sampled, accepted);
            nb::list result;
            for (const auto& f : finished)
              result.append(nb::make_tuple(f.req_id, lightspeed::fsm::reason_name(f.reason)));
            return result;
          },
          "plan"_a, "sampled_token_ids"_a, "accepted_counts"_a = nb::none(),
          "Consumes the oldest in-flight plan: int32[S] samples (and, with speculative rows, "
          "accepted_counts int32[num_decodes] in [1, k+1]). Acknowledges its copies. Returns "
          "[(req_id, reason)] with reason in {'stop', 'length', 'abort'}.")
      .def(
          "request_stats",
          [](const Scheduler& s, int64_t req_id) {
            const auto st = s.request_stats(req_id);
            nb::dict d;
            d["num_prompt_tokens"] = st.num_prompt_tokens;
            d["num_cached_tokens"] = st.num_cached_tokens;
            d["num_output_tokens"] = st.num_output_tokens;
            d["state"] = st.state;
            return d;
          },
          "req_id"_a, "Per-request counters; available until the advance() after the one reporting it finished.")
      .def(
          "output_token_ids",
          [](const Scheduler& s, int64_t req_id) {
            auto ids = s.output_token_ids(req_id);
            return std::vector<int32_t>(ids.begin(), ids.end());
          },
          "req_id"_a, "Accepted output tokens so far (a copy).")
      .def(
          "stats",
          [](const Scheduler& s) {
            const auto st = s.stats();
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
            d["cached_device_pages"] = st.cached_device_pages;
            d["cached_host_pages"] = st.cached_host_pages;
            d["num_in_flight_plans"] = st.num_in_flight_plans;
            d["prefix_hit_tokens"] = st.prefix_hit_tokens;
            d["prefix_query_tokens"] = st.prefix_query_tokens;
            d["num_retractions"] = st.num_retractions;
            d["num_steps"] = st.num_steps;
            return d;
          },
          "Counters: pages, queue lengths, prefix-cache hits, retractions.")
      .def("has_unfinished", &Scheduler::has_unfinished,
           "True while a request is live or an abort is yet to be reported by advance().")
      .def_prop_ro("num_unfinished", &Scheduler::num_unfinished, "Live requests plus unreported aborts.")
      .def("check_invariants", &Scheduler::check_invariants,
           "Recounts every page reference; raises RuntimeError on a broken invariant (tests, O(pages)).");
}
