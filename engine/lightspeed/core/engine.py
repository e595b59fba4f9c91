"""Engine: the scheduler and the model runner in one process, driven by request messages.

`step()` is the whole hot path, one screen: land finished KV copies -> plan step N+1 -> launch it
(the GPU queues it behind step N) -> collect step N's tokens -> advance the scheduler -> one
columnar `StepOutputs` message for step N, sent while step N+1 runs. With `async_scheduling` off,
or while a grammar-constrained request needs its tokens on the host, a step is collected right
after its launch (the synchronous loop, for debugging). The only per-request Python work per
step is naming the rows of the message.

Faults (see faults.py): admission checks everything a request carries, so a bad one is rejected
alone; a request whose own state fails while running is aborted and reported with finish reason
"error" (`take_errors`); a launch that fails as a whole fails that plan's requests (`StepGuard`).
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future

import numpy as np
import torch

from ..config import EngineConfig
from ..runner.factory import MAX_EOS_TOKEN_IDS, build_model_runner
from ..runner.model_runner import LaunchedStep
from ..runner.structured import KINDS
from . import messages as m
from .faults import StepGuard, is_fatal, request_error_message

_NO_OUTPUTS = m.StepOutputs([], [])
# Start-up reads the disk tier's index within this bound; at shutdown, pages still queued for disk
# are written for at most this long (the client stops waiting for the core after 5 s).
_DISK_INDEX_BUDGET_S = 10.0
_DISK_FLUSH_S = 3.0
# A plan with no rows while copies are in flight: every request waits on a copy or a disk read.
# Waiting this long for one to land (instead of planning again at once) leaves the GIL to the disk
# tier's threads, which a spinning step loop starves on a small machine.
_COPY_WAIT_S = 0.001
# The start-up warm-up request (two output tokens) finishes in a few steps; more means it is stuck.
_WARM_UP_MAX_STEPS = 64

log = logging.getLogger("lightspeed.core")


class Engine:
    def __init__(self, config: EngineConfig, *, on_rank_failure=None):
        """`on_rank_failure(message)`: called (from a watchdog thread, just before the process exits)
        when another tensor/expert-parallel rank of this engine dies."""
        from lightspeed_scheduler import Scheduler, SchedulerConfig

        self.config = config
        from ..envs import ENVS

        threads = config.num_threads or ENVS.num_threads
        if threads:
            torch.set_num_threads(threads)
        built = build_model_runner(config, output_tokens_of=self._output_tokens_of, on_rank_failure=on_rank_failure)
        self.runner, self.model_config, self.max_model_len = built.runner, built.model_config, built.max_model_len
        self.built = built
        self.vocab_size = built.model_config.vocab_size
        spec = self.runner.spec  # speculative decoding: drafts per step and the KV they need
        self.scheduler = Scheduler(SchedulerConfig(
            page_size=config.page_size, num_device_pages=built.num_device_pages,
            num_host_pages=built.num_host_pages, max_num_seqs=config.max_num_seqs,
            num_spare_slots=config.num_spare_slots,
            max_num_batched_tokens=config.max_num_batched_tokens,
            chunked_prefill_size=config.chunked_prefill_size, max_model_len=self.max_model_len,
            policy=config.policy, enable_prefix_cache=config.enable_prefix_cache, async_copies=True,
            eviction_policy=config.eviction_policy,
            max_write_through_pages=built.max_write_through_pages, num_disk_pages=built.num_disk_pages,
            max_disk_write_pages=built.max_disk_write_pages,
            max_num_draft_tokens=spec.k if spec is not None else 0,
            num_lookahead_tokens=spec.lookahead if spec is not None else 0))
        self.disk = self.runner.kv_cache.disk  # kv.disk.DiskKVTier, or None
        self._disk_writes_stopped = False
        if self.disk is not None:
            self._restore_disk()
        self._in_flight: LaunchedStep | None = None  # launched, not yet collected
        self._guard = StepGuard(self.runner, self._fail_requests)
        self._compiling: dict[str, tuple[m.AddRequest, Future]] = {}  # waiting for their grammar
        self._rejected: dict[str, str] = {}   # rejected after add_request returned (their grammar failed)
        self._failed: dict[str, str] = {}     # failed while running: finish reason "error"
        self._ids: dict[str, int] = {}        # client request id -> scheduler id
        self._names: dict[int, str] = {}      # scheduler id -> client request id
        self._awaiting_first: set[int] = set()
        self._num_steps = 0
        self._num_generated = 0
        self._num_prefill_tokens = 0
        if self.runner.device.type != "cpu":
            # The tokenizer and xgrammar's compiler, built now on the grammar worker rather than by the
            # first constrained request. Not on CPU: there the worker would share the few cores with
            # the step loop, and an engine per test would each load a tokenizer it may never use.
            self.runner.structured.warm()

    def warm_up(self) -> float:
        """Run one short request through the real step path before the engine reports ready, so the
        first user request does not pay the first-use costs of its kernels: Triton compiles for the
        prefill and sampling kernels, a JIT-compiled backend's nvcc build (FlashInfer's FA3 prefill
        takes minutes), the allocator's first blocks. vLLM does the same with its dummy runs.

        The request is internal: its id cannot collide with a client's (the client names requests
        with a uuid), its pages stay in the prefix cache as ordinary reusable pages (its pseudo-random
        prompt matches no real one), and the step and token counters are reset afterwards. Returns
        the seconds it took."""
        started = time.monotonic()
        page = self.config.page_size
        length = max(1, min(2 * page + 1, self.max_model_len - 2))  # two full pages and a partial one
        prompt = [(i * 7919 + 104729) % self.vocab_size for i in range(length)]
        name = "\x00lightspeed-warm-up"
        error = self.add_request(m.AddRequest(name, prompt, m.SamplingSpec(max_tokens=2, temperature=0.0,
                                                                           ignore_eos=True)))
        if error is not None:
            raise RuntimeError(f"the start-up warm-up request was rejected: {error}")
        for _ in range(_WARM_UP_MAX_STEPS):
            self.step()
            if name not in self._ids and self._in_flight is None:
                break
        else:
            raise RuntimeError(f"the start-up warm-up request did not finish in {_WARM_UP_MAX_STEPS} steps")
        errors = self.take_errors()
        if errors is not None:
            raise RuntimeError(f"the start-up warm-up request failed: {errors.failed or errors.errors}")
        self._num_steps = self._num_generated = self._num_prefill_tokens = 0
        return time.monotonic() - started

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, msg: m.AddRequest) -> str | None:
        """Admit a request; returns an error message instead when it is invalid or cannot be admitted.
        A constrained request waits here (not in the scheduler) until its grammar has compiled."""
        try:
            error = self._check(msg)
            if error is not None or msg.sampling.structured_kind is None:
                return error or self._submit(msg, None)
            spec = msg.sampling
            self._compiling[msg.request_id] = (msg, self.runner.structured.compile(spec.structured_kind,
                                                                                   spec.structured_spec or ""))
            return None
        except Exception as error:  # anything else about this request fails it alone
            if is_fatal(error):
                raise
            log.error("request %r could not be admitted", msg.request_id, exc_info=error)
            return request_error_message(error)

    def admit_compiled(self) -> None:
        """Submit the requests whose grammar is ready; one whose grammar failed is rejected."""
        for name, (msg, future) in list(self._compiling.items()):
            if not future.done():
                continue
            del self._compiling[name]
            try:
                error = self._submit(msg, future.result())
            except Exception as e:
                if is_fatal(e):
                    raise
                error = request_error_message(e)
            if error is not None:
                self._rejected[name] = error

    def has_pending_grammars(self) -> bool:
        return bool(self._compiling)

    def _check(self, msg: m.AddRequest) -> str | None:
        name, spec, prompt = msg.request_id, msg.sampling, msg.prompt_token_ids
        config = self.config
        if name in self._ids or name in self._compiling:
            return f"request id {name!r} is already running"
        if not prompt:
            return "the prompt is empty"
        ids = np.asarray(prompt, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.vocab_size)][0])
            return f"prompt token id {bad} is out of vocabulary (size {self.vocab_size})"
        if len(prompt) >= self.max_model_len:
            return (f"the prompt has {len(prompt)} tokens but max_model_len is {self.max_model_len} "
                    f"(prompt plus at least one output token must fit)")
        if spec.logprobs is not None and not 0 <= spec.logprobs <= config.max_logprobs:
            return f"logprobs={spec.logprobs} is outside [0, max_logprobs={config.max_logprobs}]"
        for field, values, limit in (("logit_bias", spec.logit_bias or {}, config.max_logit_bias),
                                     ("stop_token_ids", spec.stop_token_ids, config.max_stop_token_ids),
                                     ("eos_token_ids", spec.eos_token_ids, MAX_EOS_TOKEN_IDS)):
            if len(values) > limit:
                return f"{field} has {len(values)} entries; this engine allows at most {limit}"
            if any(not 0 <= t < self.vocab_size for t in values):
                return f"a token id in {field} is out of vocabulary (size {self.vocab_size})"
        # Clients other than SamplingParams can reach the core: values bound for fixed-width device
        # tensors and the sampler are checked here, so a bad one fails its request, not a batch.
        numbers = [spec.temperature, spec.top_p, spec.min_p, spec.presence_penalty, spec.frequency_penalty,
                   spec.repetition_penalty, *(spec.logit_bias or {}).values()]
        if not all(math.isfinite(x) for x in numbers):
            return "sampling parameters must be finite numbers"
        if spec.temperature < 0 or not 0 < spec.top_p <= 1 or not 0 <= spec.min_p <= 1 or spec.repetition_penalty <= 0:
            return "temperature must be >= 0, top_p in (0, 1], min_p in [0, 1] and repetition_penalty > 0"
        if not -(2**31) <= spec.top_k < 2**31:
            return f"top_k={spec.top_k} is out of range"
        if spec.seed is not None and not 0 <= spec.seed < 2**63:
            return f"seed={spec.seed} is out of range [0, 2**63)"
        if not -(2**31) < msg.priority < 2**31:
            return f"priority={msg.priority} is out of range (a 32-bit integer)"
        if spec.max_tokens < 1:
            return f"max_tokens must be >= 1, got {spec.max_tokens}"
        if spec.structured_kind is not None and spec.structured_kind not in KINDS:
            return f"unknown structured output kind {spec.structured_kind!r}"
        if len(self._names) + len(self._compiling) >= config.max_num_seqs + config.max_queued_requests:
            return (f"the engine's queue is full (max_num_seqs + max_queued_requests = "
                    f"{config.max_num_seqs + config.max_queued_requests} unfinished requests); retry later")
        return None

    def _submit(self, msg: m.AddRequest, grammar) -> str | None:
        from lightspeed_scheduler import RequestSpec

        name, spec, prompt = msg.request_id, msg.sampling, msg.prompt_token_ids
        max_new = min(spec.max_tokens, self.max_model_len - len(prompt))
        try:
            req_id = self.scheduler.submit(RequestSpec(
                rid=name, token_ids=prompt, max_new_tokens=max_new, eos_token_ids=list(spec.eos_token_ids),
                stop_token_ids=list(spec.stop_token_ids), ignore_eos=spec.ignore_eos, priority=-msg.priority,
                retention=self.config.session_retention if msg.session_id else 0,
                num_draft_tokens=0))
        except ValueError as e:
            return str(e)
        try:
            self.runner.add_request(req_id, spec, prompt, grammar, msg.session_id)
        except BaseException:
            self.scheduler.abort(req_id)
            raise
        self._ids[name], self._names[req_id] = req_id, name
        self._awaiting_first.add(req_id)
        return None

    def _fail_requests(self, req_ids: list[int], message: str) -> None:
        """Requests that failed while running: aborted now, reported with finish reason "error"."""
        for req_id in req_ids:
            name = self._names.get(req_id)
            if name is None:
                continue  # finished or failed already
            try:
                self.scheduler.abort(req_id)
            except ValueError:
                pass
            self._forget(req_id)
            self._failed[name] = message

    def take_errors(self, rejected: dict[str, str] | None = None) -> m.RequestErrors | None:
        """Requests rejected (`rejected`, plus grammars that failed) or failed since the last call."""
        self._guard.settle()
        rejected = {**(rejected or {}), **self._rejected}
        if not rejected and not self._failed:
            return None
        errors = m.RequestErrors(rejected, self._failed)
        self._rejected, self._failed = {}, {}
        return errors

    def abort_requests(self, names: list[str]) -> None:
        for name in names:
            if self._compiling.pop(name, None) is not None:
                continue  # its grammar was still compiling: it never reached the scheduler
            req_id = self._ids.get(name)
            if req_id is None:
                continue
            try:
                self.scheduler.abort(req_id)
            except ValueError:
                pass  # finished in the meantime
            self._forget(req_id)

    def _forget(self, req_id: int) -> None:
        name = self._names.pop(req_id, None)
        if name is not None:
            self._ids.pop(name, None)
        self._awaiting_first.discard(req_id)
        self.runner.remove_request(req_id)

    def has_work(self) -> bool:
        """Requests to step, a launched step to collect, or an unreported abort (advance() reports it)."""
        return bool(self._names) or self._in_flight is not None or self.scheduler.has_unfinished()

    def has_pending_copies(self) -> bool:
        """KV copies in flight or queued: an idle engine keeps stepping (copies only) until they land."""
        return self.scheduler.has_pending_copies()

    @property
    def steps_with_others(self) -> bool:
        """Data-parallel engine cores share this one's world (expert parallelism across them)."""
        return self.runner.steps_with_others

    def agree_to_step(self, has_work: bool, stopping: bool = False) -> tuple[bool, bool]:
        """(step now?, stop now?): this core's own answer, or the answer of every core it steps with."""
        return self.runner.agree_to_step(has_work, stopping)

    def _output_tokens_of(self, req_id: int) -> list[int]:
        return self.scheduler.output_token_ids(req_id)

    def _restore_disk(self) -> None:
        """The prefixes a previous engine left on disk become disk-tier cache pages."""
        started = time.monotonic()
        index = self.disk.load_index(_DISK_INDEX_BUDGET_S)
        accepted = self.scheduler.restore_disk_pages(index.slots, index.keys, index.parent_keys, index.depths,
                                                     index.tokens)
        self.disk.stats.restored_pages = int(accepted.sum())
        self.disk.stats.rejected_records = index.num_rejected + int((~accepted).sum())
        log.info("disk KV tier %s: %d pages restored in %.2f s (%d records rejected, %d unread: start-up bound)",
                 self.disk.data_path, self.disk.stats.restored_pages, time.monotonic() - started,
                 self.disk.stats.rejected_records, index.num_unread)

    # -- the step --------------------------------------------------------------------------------
    def step(self) -> m.StepOutputs:
        """Launch the next plan, then collect the one before it (or this one, when not overlapping)."""
        self._land_copies()
        overlap = self.config.async_scheduling and not self.runner.needs_host_tokens()
        if self._in_flight is not None and not overlap:
            done, self._in_flight = self._in_flight, None   # a grammar needs step N's token first
            self.runner.step_without_plan()                 # cores stepping together still meet
            return self._complete(done)
        plan = self.scheduler.next_plan(**self.runner.draft_args())
        launched = (plan, self._guard.launch(plan))   # a failure costs the plan's requests, not the core
        if overlap and plan.num_reqs:
            done, self._in_flight = self._in_flight, launched
            return self._complete(done) if done is not None else _NO_OUTPUTS
        # Synchronous, or a plan with no rows (copies only): nothing to overlap, complete in order.
        earlier = self._complete(self._in_flight) if self._in_flight is not None else None
        self._in_flight = None
        latest = self._complete(launched)
        if not plan.num_reqs and earlier is None and self.has_pending_copies():
            self._wait_for_copies(_COPY_WAIT_S)
        return earlier if earlier is not None else latest

    def _wait_for_copies(self, timeout_s: float) -> None:
        if self.disk is not None and self.disk.num_in_flight:
            self.disk.wait_any(timeout_s)
        else:
            time.sleep(timeout_s / 4)  # device copies land within microseconds: poll sooner

    def _complete(self, done: tuple) -> m.StepOutputs:
        plan, launched = done
        result = self.runner.collect(launched)
        names = self._names
        finished = self.scheduler.advance(plan, result.tokens, result.accepted_counts)
        # A row's output is its first appended_counts samples: 1 per decode, up to k + 1 with k
        # drafts, 0 for a row whose request finished or was aborted after the plan was built.
        sample_rows = plan.sample_batch_rows
        per_row = np.bincount(sample_rows, minlength=plan.num_reqs)
        position = np.arange(sample_rows.shape[0]) - (np.cumsum(per_row) - per_row)[sample_rows]
        kept = position < plan.appended_counts[sample_rows]
        rows = [i for i, r in zip(np.nonzero(kept)[0].tolist(), result.req_ids[kept].tolist(), strict=True)
                if r in names]
        req_ids = result.req_ids[rows]
        cached, by_tier = self._first_token_cached(req_ids.tolist())
        self._num_steps += 1
        self._num_generated += len(rows)
        self._num_prefill_tokens += plan.num_tokens - plan.num_decode_tokens
        out_names = [names[r] for r in req_ids.tolist()]
        tokens = result.tokens[rows].tolist()
        logprobs = self._logprobs(result, names, kept) if result.logprob_rows is not None else None
        done_names = None
        if finished:
            done_names = {names[r]: reason for r, reason in finished if r in names}
            for r, _ in finished:
                self._forget(r)
        return m.StepOutputs(out_names, tokens, logprobs, cached, done_names, cached_tokens_by_tier=by_tier)

    @staticmethod
    def _logprobs(result, names: dict[int, str], kept: np.ndarray) -> dict[str, list[m.TokenLogprobs]]:
        logprobs: dict[str, list[m.TokenLogprobs]] = {}
        for i, row in enumerate(result.logprob_rows.tolist()):
            name = names.get(int(result.req_ids[row]))
            if name is None or not kept[row]:
                continue
            n = int(result.top_n[i])
            logprobs.setdefault(name, []).append(m.TokenLogprobs(
                float(result.token_logprobs[i]), int(result.ranks[i]), result.top_ids[i, :n].tolist(),
                result.top_logprobs[i, :n].tolist()))
        return logprobs

    def shutdown(self) -> None:
        """Stop the other ranks, if any (after `drain_copies`)."""
        self.runner.shutdown()

    def _land_copies(self) -> None:
        """Acknowledge the KV copies and disk ops that have landed: polled, never waited for."""
        for step_id in self.runner.kv_cache.copier.poll():
            self.scheduler.copies_done(step_id)
        if self.disk is None:
            return
        for step_id, failed_writes, failed_reads in self.disk.poll():
            self.scheduler.disk_done(step_id, failed_writes, failed_reads)
        if self.disk.writes_stopped and not self._disk_writes_stopped:
            self._disk_writes_stopped = True
            self.scheduler.stop_disk_writes()

    def drain_copies(self, flush_s: float = _DISK_FLUSH_S) -> None:
        """Shutdown: with a disk tier, live requests are aborted and pages still queued for disk are
        written (for at most flush_s), so a restart finds them; then every KV copy in flight lands."""
        if self.disk is not None:
            self.abort_requests(list(self._ids))
            deadline = time.monotonic() + flush_s
            while (self.has_work() or self.scheduler.has_pending_copies()) and time.monotonic() < deadline:
                self.step()
                if self.disk.num_in_flight:
                    time.sleep(0.001)
        for step_id in self.runner.kv_cache.copier.wait_all():
            self.scheduler.copies_done(step_id)
        if self.disk is not None:
            for step_id, failed_writes, failed_reads in self.disk.wait_all():
                self.scheduler.disk_done(step_id, failed_writes, failed_reads)
            self.disk.close()

    def _first_token_cached(self, req_ids: list[int]) -> tuple[dict[str, int] | None, dict[str, list[int]] | None]:
        """Prompt tokens served from the prefix cache, in all and [device, host, disk], of requests
        sampling their first token now."""
        if not self._awaiting_first:
            return None, None
        firsts = self._awaiting_first.intersection(req_ids)
        if not firsts:
            return None, None
        self._awaiting_first -= firsts
        cached, by_tier = {}, {}
        for r in firsts:
            st = self.scheduler.request_stats(r)
            cached[self._names[r]] = int(st["num_cached_tokens"])
            by_tier[self._names[r]] = [int(st["num_cached_device_tokens"]), int(st["num_cached_host_tokens"]),
                                       int(st["num_cached_disk_tokens"])]
        return cached, by_tier

    # -- reporting ---------------------------------------------------------------------------------
    def stats(self) -> m.EngineStats:
        s = self.scheduler.stats()
        total = self.built.num_device_pages - 1  # page 0 is padding
        free = int(s["free_device_pages"])
        reusable = free + int(s.get("unreferenced_cached_device_pages", 0))  # cached, no request holds it
        return m.EngineStats(
            num_running=int(s["num_running"]), num_waiting=int(s["num_waiting"]),
            num_retracted=int(s.get("num_retracted", 0)),
            kv_usage=max(0.0, 1.0 - reusable / total) if total > 0 else 0.0,
            num_device_pages=self.built.num_device_pages, free_device_pages=free,
            free_host_pages=int(s["free_host_pages"]), prefix_hit_tokens=int(s["prefix_hit_tokens"]),
            prefix_query_tokens=int(s["prefix_query_tokens"]), num_steps=self._num_steps,
            num_generated_tokens=self._num_generated, timestamp=time.time(),
            cached_device_pages=int(s["cached_device_pages"]), num_prefill_tokens=self._num_prefill_tokens,
            expert_load=self.runner.expert_load_counts(), **self._tier_stats(s),
            **self._spec_stats())

    def _tier_stats(self, s: dict) -> dict[str, int]:
        copier, page_bytes = self.runner.kv_cache.copier, self.runner.kv_cache.layout.bytes_per_page
        disk = self.disk.stats if self.disk is not None else None
        return dict(device_hit_tokens=int(s["device_hit_tokens"]), host_hit_tokens=int(s["host_hit_tokens"]),
                    disk_hit_tokens=int(s["disk_hit_tokens"]), host_bytes_written=copier.pages_written * page_bytes,
                    host_bytes_read=copier.pages_loaded * page_bytes,
                    disk_bytes_written=disk.bytes_written if disk else 0, disk_bytes_read=disk.bytes_read if disk else 0,
                    disk_read_failures=disk.read_failures if disk else 0,
                    disk_write_errors=disk.write_errors if disk else 0, cached_disk_pages=int(s["cached_disk_pages"]))

    def _spec_stats(self) -> dict:
        spec = self.runner.spec
        if spec is None:
            return {}
        st = spec.stats
        return dict(spec_num_drafts=st.num_drafts, spec_num_draft_tokens=st.num_draft_tokens,
                    spec_num_accepted_tokens=st.num_accepted_tokens,
                    spec_acceptance_lengths=list(st.acceptance_lengths))

    def ready_message(self) -> m.Ready:
        b = self.built
        return m.Ready(
            pid=__import__("os").getpid(), vocab_size=self.vocab_size, max_model_len=self.max_model_len,
            num_device_pages=b.num_device_pages, num_host_pages=b.num_host_pages, page_size=self.config.page_size,
            device=str(b.device), dtype=str(b.dtype).removeprefix("torch."),
            kv_cache_dtype=str(b.kv_dtype).removeprefix("torch."),
            eos_token_ids=list(self.model_config.eos_token_ids),
            rank_pids=list(getattr(self.runner, "rank_pids", [])), steps_with_others=self.steps_with_others)
