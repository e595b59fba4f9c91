"""ModelRunner: a scheduler plan in, sampled tokens out, in two halves so steps can overlap.

launch(plan): hand the plan's KV page copies to the copier (they run beside the forward on their own
stream) and its disk ops to the disk tier (on its own threads) -> bind newly scheduled requests to
their state rows -> build input tensors -> forward
-> logits at the sampled positions -> logprobs (of the raw logits, when asked) -> penalties / bias
/ min_tokens / grammar masks -> batched sampler -> the tokens on their way to the host (step_io.py)
and an event. collect(launched): wait for that event only, then hand back host arrays.

A step's inputs go up and its results come down as `LIGHTSPEED_STEP_IO` says (step_io.py). By default (`kernel`) a
Triton kernel moves them through pinned memory, beside the copy engine, which the KV host tier's write-through
holds for milliseconds at a time. With `stream` they are copy-engine copies, the results on a stream of their own
that the KV tier's copies queue after.

The engine launches plan N+1 before it collects plan N, so the CPU builds and launches a step
while the GPU runs the one before: a decode whose input is plan N's sample reads it on the device
(deferred inputs). The only host wait is the event of the step being collected.

Per-request work (binding a request's sampling rows, its grammar matcher) fails that request only:
the runner records it (`take_failures`), leaves its row harmless for the step, and the engine
aborts the request. Copies go first, so a plan whose launch fails still hands its copies over.

The forward is eager, or replayed from CUDA graphs for decode-only steps when a `CudaGraphRunner`
is plugged in (`graphs`, set by the factory on GPU; see cuda_graph.py); prefill and mixed steps of
few enough tokens replay piecewise graphs, attention alone eager (`piecewise`, piecewise_graph.py).
Sampling is eager, except a decode graph's step whose rows are all plain greedy (no penalties, bias,
min_tokens or grammar): its tokens are the argmax the graph computed (`SamplingState.plain_greedy`).

Speculative decoding plugs in as `spec` (a `lightspeed.spec.SpecDecoder`, set by the factory): it
supplies the plan's drafts, fixes speculative rows' inputs on the device, and its SpecStep
verifies the drafts in the sampler, after every sampling transform (lightspeed/spec/step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # the runner never needs msgspec at run time (GPU benchmarks drive it directly)
    from ..core.messages import SamplingSpec
    from ..spec.decoder import SpecDecoder, SpecLaunch
    from ..spec.step import SpecStep
    from .cuda_graph import CudaGraphRunner
    from .piecewise_graph import PiecewiseGraphRunner

from ..envs import ENVS
from ..kv import CudaPageCopier, KVCache, KVTransferError
from .expert_load import ExpertLoad
from .inputs import InputBuilder, StepTensors, upload
from .sampling_state import SamplingState
from .step_io import ResultCopies
from .structured import StructuredOutputs


@dataclass
class LaunchedStep:
    """A plan whose work is enqueued; `ModelRunner.collect` turns it into a StepResult."""

    step_id: int
    req_ids: np.ndarray                       # int64 [S]: the request of each sampled position
    tokens: torch.Tensor | None = None        # int32 [S] on the host, valid once `ready` has fired
    ready: torch.cuda.Event | None = None     # recorded after the host copies (None on CPU: done)
    structured_rows: np.ndarray | None = None
    logprobs: tuple | None = None             # (rows, top_n, token_lp, ranks, top_ids, top_lp) on the host
    sample_slots: np.ndarray | None = None    # int64 [S]: the state row of each sample
    spec: SpecLaunch | None = None            # speculative decoding: what collect() verifies against
    accepted_counts: np.ndarray | None = None  # int32 [num_decodes], fixed: a stand-in for a failed launch


@dataclass
class StepResult:
    tokens: np.ndarray                       # int32 [S], for scheduler.advance
    req_ids: np.ndarray                      # int64 [S]: the request of each sampled token
    logprob_rows: np.ndarray | None = None   # rows (into S) whose request asked for logprobs
    token_logprobs: np.ndarray | None = None  # fp32 [R]
    ranks: np.ndarray | None = None           # int64 [R]
    top_ids: np.ndarray | None = None         # int64 [R, n]
    top_logprobs: np.ndarray | None = None    # fp32 [R, n]
    top_n: np.ndarray | None = None           # int64 [R]: how many of the top entries each row asked for
    accepted_counts: np.ndarray | None = None  # int32 [num_decodes]: tokens each decode row keeps (spec)


class ModelRunner:
    """Runs plans on one model with its paged KV cache (one device). `num_slots`: rows of per-request state, the
    scheduler's num_slots (EngineConfig.num_request_slots), which plan.req_slots index."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, *, num_slots: int, vocab_size: int,
                 device: torch.device, engine_seed: int = 0, load_tokenizer: Callable[[], Any] | None = None,
                 output_tokens_of: Callable[[int], list[int]] | None = None, max_logit_bias: int = 1024,
                 max_stop_ids: int = 80, grammar_cache_size: int = 256):
        self.model, self.kv_cache, self.device = model, kv_cache, device
        self.vocab_size = vocab_size
        self.sampling = SamplingState(num_slots, vocab_size, device, engine_seed, max_logit_bias=max_logit_bias,
                                      max_stop_ids=max_stop_ids)
        self.structured = StructuredOutputs(load_tokenizer or _no_tokenizer, vocab_size, grammar_cache_size)
        self._failures: list[tuple[int, BaseException]] = []  # (request id, error) of per-request failures
        self._result_copies = ResultCopies(device, ENVS.step_io)  # resolves the mode: probes kernel transfers
        self.inputs = InputBuilder(device, self._result_copies.mode)
        if self._result_copies.stream is not None and isinstance(kv_cache.copier, CudaPageCopier):
            kv_cache.copier.copy_after(self._result_copies.stream)  # token copies ahead of KV pages on the engine
        self._slot_owner = np.full(num_slots, -1, dtype=np.int64)  # req id bound to each state row
        self._requests: dict[int, tuple[SamplingSpec, list[int], str | None]] = {}
        self._slot_of: dict[int, int] = {}
        self._output_tokens_of = output_tokens_of
        self._prev_sampled: torch.Tensor | None = None
        self._graph_greedy: torch.Tensor | None = None  # the decode graph's argmax rows of this step's logits
        self.graphs: CudaGraphRunner | None = None  # decode steps it can run are replayed, the rest eager
        self.piecewise: PiecewiseGraphRunner | None = None  # prefill / mixed steps it can run, piece by piece
        self.expert_load = ExpertLoad(model, device)
        self.spec: SpecDecoder | None = None        # speculative decoding (None: off)
        self._hidden: torch.Tensor | None = None    # the last eager forward's hidden states (device drafters)

    # -- request lifecycle ---------------------------------------------------------------------
    def add_request(self, req_id: int, spec: SamplingSpec, prompt_ids: list[int], grammar: Any = None,
                    session_id: str | None = None) -> None:
        """Register a request's sampling state (bound to a row when first scheduled); `grammar` is its
        compiled grammar (`structured.compile(...)`'s result) when it asks for structured output.
        session_id: its conversation (speculative suffix drafting matches within it)."""
        if spec.structured_kind is not None:
            self.structured.start(req_id, grammar)
        self._requests[req_id] = (spec, prompt_ids, session_id)

    def remove_request(self, req_id: int) -> None:
        self._requests.pop(req_id, None)
        self.structured.remove(req_id)
        slot = self._slot_of.pop(req_id, None)
        if slot is not None and self._slot_owner[slot] == req_id and self.spec is not None:
            self.spec.release(slot)

    def take_failures(self) -> list[tuple[int, BaseException]]:
        """(request id, error) of requests whose own state failed since the last call; the engine fails them."""
        failures, self._failures = self._failures + self.structured.take_failures(), []
        return failures

    def _bind_new_rows(self, plan) -> None:
        new_rows = np.nonzero(self._slot_owner[plan.req_slots] != plan.req_ids)[0]
        for row in new_rows.tolist():  # only requests entering (or re-entering) the batch
            req_id, slot = int(plan.req_ids[row]), int(plan.req_slots[row])
            self._slot_owner[slot] = req_id
            self._slot_of[req_id] = slot
            try:
                spec, prompt, session_id = self._requests[req_id]
                # A retracted request coming back keeps its RNG counter and penalty counts.
                done = self._output_tokens_of(req_id) if self._output_tokens_of else []
                self.sampling.bind(slot, req_id, spec, prompt, done)
                if self.spec is not None:
                    self.spec.bind(slot, spec, prompt, done, session_id)
            except Exception as e:
                self.sampling.unbind(slot)
                if self.spec is not None:
                    self.spec.release(slot)  # no drafts for a row that fails (idempotent)
                self._failures.append((req_id, e))

    # -- one step ------------------------------------------------------------------------------
    def needs_host_tokens(self) -> bool:
        """True while the next step needs the previous step's tokens on the host, so the engine
        collects each step before launching the next: a live grammar-constrained request (its next
        bitmask), or a host drafter (n-gram / suffix). Drafts proposed behind a step still in flight
        build on a guess of its outcome; served on the re-quoting trace that collapsed acceptance
        (bench/results/spec_cpu_smol_2026-12-01_162118_sync_vs_overlap: 87% of draft tokens accepted
        stepping one at a time, 11% overlapped, and 2.4x the tok/s/user)."""
        return bool(self.structured.matchers) or (self.spec is not None and self.spec.drafts_on_host)

    def known_token(self, req_id: int, position: int) -> int:
        """Token `position` of a request's known sequence (prompt, then accepted outputs)."""
        prompt = self._requests[req_id][1]
        if position < len(prompt):
            return int(prompt[position])
        return int(self._output_tokens_of(req_id)[position - len(prompt)])

    def draft_args(self) -> dict:
        """Keyword arguments of the scheduler's next_plan(): this step's drafts (none without spec)."""
        return self.spec.plan_args() if self.spec is not None else {}

    @torch.inference_mode()
    def launch(self, plan) -> LaunchedStep:
        """Enqueue the plan's copies, forward and sampling; returns at once on GPU."""
        try:  # before anything of the step: a failure here must end the core (KVTransferError)
            if plan.has_copies:
                self.kv_cache.copier.submit(int(plan.step_id), plan.write_back, plan.load_back,
                                            bool(plan.forward_waits_for_copies))
            if plan.has_disk_ops:
                self.kv_cache.disk.submit(plan)
        except Exception as e:
            raise KVTransferError(f"step {int(plan.step_id)}: KV copies could not be started ({e})") from e
        self._bind_new_rows(plan)
        if plan.input_ids.shape[0] == 0:
            return LaunchedStep(int(plan.step_id), np.empty(0, np.int64), torch.empty(0, dtype=torch.int32))
        t = self.inputs.build(plan, self._prev_sampled)
        step, spec_launch = self.spec.prepare(plan, t, self._prev_sampled) if self.spec is not None else (None, None)
        logits = self.forward(plan, t)
        return self._sample(plan, logits, t, step, spec_launch)

    def collect(self, launched: LaunchedStep) -> StepResult:
        """Wait for a launched step's tokens (its event, nothing else) and return them."""
        if launched.ready is not None:
            launched.ready.synchronize()
        h_tokens = launched.tokens.numpy()
        result = StepResult(h_tokens, launched.req_ids, accepted_counts=launched.accepted_counts)
        if launched.spec is not None:
            owned = self._slot_owner[launched.sample_slots] == launched.req_ids
            result.accepted_counts = self.spec.collect(launched.spec, launched.sample_slots, h_tokens, owned)
        if launched.structured_rows is not None:
            self.structured.accept(launched.req_ids, launched.structured_rows, h_tokens)
        if launched.logprobs is not None:
            rows, top_n, token_lp, ranks, top_ids, top_lp = launched.logprobs
            result.logprob_rows, result.top_n = rows, top_n
            result.token_logprobs, result.ranks = token_lp.numpy(), ranks.numpy()
            result.top_ids, result.top_logprobs = top_ids.numpy(), top_lp.numpy()
        return result

    def expert_load_counts(self) -> list[int] | None:
        """Tokens routed to each expert so far (MoE models; summed over layers), refreshed about once a
        second without a device sync. A `DriverRunner` reduces token-sharded counters over its ranks."""
        load = self.expert_load
        if load.due() and not load.needs_reduce:
            load.refresh()
        return load.latest()

    @property
    def last_sampled(self) -> torch.Tensor | None:
        """Token ids int64 [S] of the latest launched step, on the device (deferred inputs read them).
        After a plain-greedy graph step this is a view of the graph's static buffer: valid until the next
        forward, so read it (on the stream) before launching another step."""
        return self._prev_sampled

    steps_with_others = False  # one engine core; see distributed.DriverRunner

    def agree_to_step(self, has_work: bool, stopping: bool) -> tuple[bool, bool]:
        return has_work, stopping

    def step_without_plan(self) -> None:
        """An engine step that launches nothing (one rank: nothing to do)."""

    def shutdown(self, graceful: bool = True) -> None:
        """Release what the runner holds beyond memory (nothing on one rank; see distributed.DriverRunner)."""

    def execute(self, plan) -> StepResult:
        """launch + collect: one synchronous step (CUDA-graph and kernel tests)."""
        return self.collect(self.launch(plan))

    def forward(self, plan, t: StepTensors) -> torch.Tensor:
        """Logits fp32 [S, V] at the plan's sampled positions."""
        self._graph_greedy = None
        if self.graphs is not None and self.graphs.can_run(plan):
            logits = self.graphs.forward(plan, t)
            self._graph_greedy = self.graphs.last_greedy
            if self.spec is not None and self.spec.needs_hidden:
                self._hidden = self.graphs.last_hidden
            return logits
        return self.forward_eager(plan, t, piecewise=True)

    def forward_unsampled(self, plan, t: StepTensors) -> None:
        """A forward whose logits nobody samples (a tensor-parallel core's dummy step). The last sampled
        tokens may be a view of a decode graph's buffer that this replay rewrites: they are copied out first."""
        if self._prev_sampled is not None:
            self._prev_sampled = self._prev_sampled.clone()
        self.forward(plan, t)
        self._graph_greedy = None

    def forward_eager(self, plan, t: StepTensors, *, piecewise: bool = False) -> torch.Tensor:
        """`forward` without the decode graphs; `piecewise`: through the piecewise graphs where they
        hold the step (only its attention eager)."""
        from ..layers.attention import AttentionMetadata, decode_query_bound

        pool = self.kv_cache.device_pool
        meta = AttentionMetadata(
            query_start_loc=t.query_start_loc, seq_lens=t.seq_lens, page_table=t.page_table,
            slot_mapping=t.slot_mapping, num_decodes=int(plan.num_decodes),
            num_decode_tokens=int(plan.num_decode_tokens), max_query_len=int(plan.max_query_len),
            max_decode_query_len=decode_query_bound(plan),
            host_query_start_loc=np.asarray(plan.query_start_loc), host_seq_lens=np.asarray(plan.seq_lens),
            kv_caches=pool.kv_caches, k_scale=pool.k_scale, v_scale=pool.v_scale)
        if piecewise and self.piecewise is not None and self.piecewise.can_run(plan):
            hidden = self.piecewise.forward(t.input_ids, t.positions, t.slot_mapping, meta)
        else:
            hidden = self.model(t.input_ids, t.positions, meta)
        if self.spec is not None and self.spec.needs_hidden:
            self._hidden = hidden
        return self.model.compute_logits(hidden[t.logits_indices]).float()

    def _sample(self, plan, logits: torch.Tensor, t: StepTensors, step: SpecStep | None = None,
                spec_launch: SpecLaunch | None = None) -> LaunchedStep:
        s, slots, h_slots = self.sampling, t.sample_slots, t.h_sample_slots
        asked = s.h_logprobs[h_slots]
        logprob_rows = np.nonzero(asked >= 0)[0]
        raw = logits[upload(logprob_rows, self.device)] if logprob_rows.size else None
        sample_pos = step.sample_pos if step is not None else None
        structured_rows = np.nonzero(s.h_structured[h_slots])[0]
        graph_greedy, self._graph_greedy = self._graph_greedy, None
        if graph_greedy is not None and not structured_rows.size and s.plain_greedy(h_slots):
            tokens = graph_greedy  # the graph's argmax of these very logits, which nothing changes
        else:
            draft_counts = None
            if step is not None and s.h_penalties[h_slots].any():
                draft_counts = step.draft_counts(plan, t.input_ids, logits.shape[0], logits.shape[1])
            logits = s.process_logits(logits, slots, h_slots, sample_pos, draft_counts)
            if structured_rows.size:
                self.structured.apply(logits, t.h_sample_req_ids, structured_rows)
            tokens = s.sample(logits, slots, h_slots, sample_pos)
        accepted = keep = None
        if step is not None:
            accepted, keep = step.verify(tokens, t.input_ids)
        s.record(tokens, slots, h_slots, keep)
        self._prev_sampled = tokens
        if self.spec is not None:
            # Its copies go first: the tokens' event below also says they landed.
            self.spec.after_sample(plan, t, step, spec_launch, tokens, accepted, keep, self._hidden,
                                   to_host=self._result_copies.to_host)
            self._hidden = None
        results = [tokens.to(torch.int32, copy=True)]  # never a view of a graph buffer the next replay rewrites
        if raw is not None:
            results += self._logprobs(raw, tokens, logprob_rows, int(asked[logprob_rows].max()))
        host, ready = self._result_copies.copy(results)
        launched = LaunchedStep(int(plan.step_id), t.h_sample_req_ids, host[0],
                                structured_rows=structured_rows if structured_rows.size else None,
                                sample_slots=h_slots, spec=spec_launch, ready=ready)
        if raw is not None:
            launched.logprobs = (logprob_rows, asked[logprob_rows], *host[1:])
        return launched

    @staticmethod
    def _logprobs(raw: torch.Tensor, tokens: torch.Tensor, rows: np.ndarray, top_n: int) -> list[torch.Tensor]:
        """[token logprob, rank, top ids, top logprobs] of the sampled `rows`, on the device."""
        from lightspeed_kernel import ops

        chosen = tokens[upload(rows, tokens.device)]
        token_lp, top_ids, top_lp = ops.compute_logprobs(raw, chosen, top_n)
        # Rank by raw logits (monotone in logprob): 1 + how many tokens are strictly more likely.
        ranks = (raw > raw.gather(1, chosen[:, None])).sum(dim=-1) + 1
        return [token_lp.float(), ranks, top_ids, top_lp.float()]


def _no_tokenizer() -> Any:
    raise ValueError("structured output needs the model's tokenizer, and none is available")
