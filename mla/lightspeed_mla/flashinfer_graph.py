"""FlashInfer's MLA decode on our plan/run contract, CUDA graphs included: the registry impl of kernel
`mla_decode_flashinfer` (:class:`FlashInferDecodeOp`).

Design note. Our decode contract plans once from shapes and reads the true lengths on the device, so a
captured graph serves every later step as it is. FlashInfer's `plan()` schedules the work on the host
from the step's lengths and copies the schedule to the device; a captured `run()` replays the schedule
of the last plan. Its CUDA-graph mode (`use_cuda_graph=True`) keeps that schedule, and the CSR metadata,
in buffers fixed when the wrapper is made, so re-planning one batch layout (rows, query tokens) for new
KV lengths keeps a captured run valid. The op therefore gives its plans a host side:

- `plan(workspace, query_start_loc, seq_lens, num_heads, ..., captured=...)` from bounding lengths, as
  for Triton. `captured=True` (a CUDA-graph runner's warm-up): a :class:`FlashInferGraphPlan`, one
  graph-mode wrapper with its reserved buffers (qo_indptr / kv_indptr [B+1], kv_len [B], kv_indices
  [B * max_pages], all int32 on the device), planned once; else a :class:`FlashInferStepPlan` (eager
  steps: a fresh wrapper each step, nothing kept per shape).
- `bind(plan, query_start_loc, seq_lens, page_table)`: the step's kv_indices from our page table, on the
  device, no sync (inside the captured graph for a graph plan: every replay rebuilds them from the
  static page table and seq_lens).
- `plan.replan(lengths)`: the host side (`lightspeed_kernel.ops.HostLengths`-like: query_start_loc
  [>= B+1], seq_lens [>= B] host arrays; the first B rows count). One host plan for every layer of a
  step: the engine calls it once a step (the graph runner before each replay, with the padded batch's
  lengths), never under capture. The host vectors are staged in fresh pinned memory, no sync.
- `run(plan, q, cache, page_table, out)`: FlashInfer's run, no allocation: capturable.

Graph plans keep what a captured launch baked in: the batch size and token count are fixed (a replan
with others raises), and so FlashInfer's cluster size (two CTAs when requests average more than 64 rows)
and its buffer offsets, which follow from them. KV lengths are free up to the reserved `max_pages`.
What FlashInfer cannot take goes to our Triton kernel at plan time (FP8 caches, head counts that do not
tile its 64-row query tiles, batches its planner refuses): `plan` then returns the Triton plan and
`bind` / `run` dispatch on it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .cache import D_LATENT, MLACache
from .decode import MLADecodePlan, _host_i32, decode_workspace_bytes, plan_decode, run_decode
from .flashinfer_mla import (
    KERNEL_NAME,
    MLACSR,
    QUERY_TILE,
    FlashInferMLA,
    _capturing,
    _next_kernel,
    host_lengths,
    kv_indices,
    schedule_refusal,
    unsupported_reason,
)


class _FlashInferPlan:
    """What both plan kinds share: the batch layout and one run."""

    def __init__(self, runner: FlashInferMLA, device: torch.device, batch_size: int, num_tokens: int,
                 num_heads: int, max_pages: int, *, page_size: int, softmax_scale: float):
        self.runner, self.device = runner, device
        self.batch_size, self.num_tokens, self.num_heads = batch_size, num_tokens, num_heads
        self.max_pages, self.page_size, self.softmax_scale = max_pages, page_size, float(softmax_scale)
        self.backend = runner.backend_for(device)
        self.wrapper = None  # planned by replan()

    def _csr(self, lengths, kv_indices_: torch.Tensor) -> MLACSR:
        """The first batch_size rows of host lengths in CSR form, checked against the layout."""
        qsl = np.asarray(lengths.query_start_loc)[: self.batch_size + 1]
        lens = np.asarray(lengths.seq_lens)[: self.batch_size]
        if qsl.shape != (self.batch_size + 1,) or lens.shape != (self.batch_size,) or int(qsl[-1]) != self.num_tokens:
            raise ValueError(f"{KERNEL_NAME}: replan for {lens.shape[0]} rows ending at token "
                             f"{int(qsl[-1]) if qsl.size else 0}, planned for {self.batch_size} rows of "
                             f"{self.num_tokens} tokens")
        qo, kv_indptr, kv_len = host_lengths(qsl, lens, self.page_size, self.max_pages)
        return MLACSR(qo, kv_indptr, kv_len, kv_indices_)

    def _plan(self, wrapper, csr: MLACSR) -> None:
        self.runner.plan_into(wrapper, csr, self.num_heads, page_size=self.page_size,
                              softmax_scale=self.softmax_scale)

    def run(self, q: torch.Tensor, cache: MLACache, out: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
        if lse is not None:
            raise ValueError(f"{KERNEL_NAME}: its plan/run path is planned without an LSE")
        if q.shape[:2] != (self.num_tokens, self.num_heads) or cache.page_size != self.page_size:
            raise ValueError(f"{KERNEL_NAME}: q {tuple(q.shape)} or page size {cache.page_size} differ from the "
                             f"plan's ({self.num_tokens}, {self.num_heads}) / {self.page_size}")
        if self.num_tokens == 0:
            return out
        if self.wrapper is None:
            raise RuntimeError(f"{KERNEL_NAME}: run before the step's replan(lengths)")
        self.wrapper.run(query=q, kv_cache=(cache.latent, cache.rope), out=out, return_lse=False)
        return out


class FlashInferGraphPlan(_FlashInferPlan):
    """A batch layout reserved in FlashInfer's CUDA-graph mode: one wrapper and its fixed buffers, planned
    at once for the bounding lengths. `bind` writes kv_indices into the reserved buffer; `replan` re-plans
    into the same wrapper. Planning happens outside graph capture; runs may be captured."""

    def __init__(self, runner: FlashInferMLA, device: torch.device, batch_size: int, num_tokens: int,
                 num_heads: int, max_pages: int, *, page_size: int, softmax_scale: float):
        super().__init__(runner, device, batch_size, num_tokens, num_heads, max_pages, page_size=page_size,
                         softmax_scale=softmax_scale)
        i32 = dict(dtype=torch.int32, device=device)
        self.qo_indptr, self.kv_indptr = torch.zeros(batch_size + 1, **i32), torch.zeros(batch_size + 1, **i32)
        self.kv_len = torch.zeros(batch_size, **i32)
        self.kv_indices = torch.zeros(batch_size * max_pages, **i32)  # zeros: page 0, valid before a bind
        self.wrapper = runner.lib.BatchMLAPagedAttentionWrapper(
            runner.workspace(device), use_cuda_graph=True, qo_indptr=self.qo_indptr, kv_indptr=self.kv_indptr,
            kv_indices=self.kv_indices, kv_len_arr=self.kv_len, backend=self.backend)

    def bind(self, page_table: torch.Tensor, seq_lens: torch.Tensor) -> FlashInferGraphPlan:
        width = page_table.shape[1]
        if page_table.shape[0] < self.batch_size or width > self.max_pages:
            raise ValueError(f"{KERNEL_NAME}: page table {tuple(page_table.shape)} outside the plan's "
                             f"[{self.batch_size}, <= {self.max_pages}]")
        kv_indices(page_table[: self.batch_size], seq_lens[: self.batch_size], self.page_size,
                   out=self.kv_indices[: self.batch_size * width])
        return self

    def replan(self, lengths) -> None:
        """Re-plan the reserved wrapper for these host lengths (kv_indices stay the bound ones: FlashInfer
        copies the reserved buffer onto itself)."""
        if _capturing(self.device):
            raise RuntimeError(f"{KERNEL_NAME}: replan under CUDA-graph capture (plan before capturing, "
                               "re-plan before each replay)")
        self._plan(self.wrapper, self._csr(lengths, self.kv_indices))


class FlashInferStepPlan(_FlashInferPlan):
    """An eager step's plan: `bind` gives a copy holding the step's kv_indices (the shape template cached
    by the caller stays bare), `replan` plans a fresh wrapper for it."""

    kv_indices: torch.Tensor | None = None

    def bind(self, page_table: torch.Tensor, seq_lens: torch.Tensor) -> FlashInferStepPlan:
        step = FlashInferStepPlan(self.runner, self.device, self.batch_size, self.num_tokens, self.num_heads,
                                  self.max_pages, page_size=self.page_size, softmax_scale=self.softmax_scale)
        step.kv_indices = kv_indices(page_table[: self.batch_size], seq_lens[: self.batch_size], self.page_size)
        return step

    def replan(self, lengths) -> None:
        if self.kv_indices is None:
            raise RuntimeError(f"{KERNEL_NAME}: replan of a plan not bound to a step")
        if _capturing(self.device):
            raise RuntimeError(f"{KERNEL_NAME}: an eager plan under CUDA-graph capture (plan with captured=True)")
        csr = self._csr(lengths, self.kv_indices)
        if self.num_tokens:
            wrapper = self.runner.lib.BatchMLAPagedAttentionWrapper(self.runner.workspace(self.device),
                                                                    backend=self.backend)
            self._plan(wrapper, csr)
            self.wrapper = wrapper


class FlashInferDecodeOp:
    """`mla_decode_flashinfer` as a registry impl: the one-shot call (`flashinfer_mla.FlashInferMLA.decode`,
    else the next kernel) and the plan / bind / run path of the module note. `lazy.get()` is the planner."""

    workspace_bytes = staticmethod(decode_workspace_bytes)  # what the Triton fallback plans need

    def __init__(self, lazy):
        self._lazy = lazy

    def prepare(self) -> None:
        """Import FlashInfer now (ImportError when it is installed but does not load)."""
        self._lazy.get()

    def __call__(self, q, cache, page_table, seq_lens, query_start_loc, softmax_scale, *, out=None,
                 return_lse=False, **plan_overrides):
        """Absorbed MLA decode through FlashInfer (FA3 on sm_90), one host plan per step. The Triton plan
        overrides (fold, tile, num_splits) apply only when the call goes on to the Triton kernel."""
        args = (q, cache, page_table, seq_lens, query_start_loc, softmax_scale)
        got = self._lazy.get().decode(*args, out=out, return_lse=return_lse)
        return got if got is not None else _next_kernel(*args, out=out, return_lse=return_lse, **plan_overrides)

    @staticmethod
    def refusal(query_start_loc: np.ndarray, num_heads: int, cache_kind: str, device: torch.device) -> str | None:
        """Why a batch layout goes to the Triton kernel (None: FlashInfer takes it)."""
        if cache_kind != "bf16":
            return "FP8 cache: FlashInfer's FP8 MLA wants an e4m3 rope with one scale"
        if (2 * QUERY_TILE) % num_heads:
            return f"{num_heads} heads do not divide FlashInfer's {2 * QUERY_TILE}-row query tiles"
        return schedule_refusal(np.diff(query_start_loc), num_heads, device)

    def plan(self, workspace: torch.Tensor, query_start_loc, seq_lens, num_heads: int, *, page_size: int,
             softmax_scale: float, cache_kind: str = "bf16", captured: bool = False, **overrides):
        """A plan from bounding host lengths: a FlashInfer plan (graph-mode when `captured`), or the Triton
        plan (`plan_decode` on `workspace`, with `overrides`) for what FlashInfer cannot take."""
        qsl, lens = _host_i32(query_start_loc), _host_i32(seq_lens)
        device = workspace.device
        if self.refusal(qsl, num_heads, cache_kind, device) is not None:
            return plan_decode(workspace, qsl, lens, num_heads, page_size=page_size, softmax_scale=softmax_scale,
                               cache_kind=cache_kind, **overrides)
        if _capturing(device):
            raise RuntimeError(f"{KERNEL_NAME}: plans are made outside CUDA-graph capture (in the warm-up)")
        batch, tokens = lens.shape[0], int(qsl[-1]) if qsl.size else 0
        max_pages = max(1, -(-int(lens.max(initial=1)) // page_size))
        args = dict(page_size=page_size, softmax_scale=softmax_scale)
        runner = self._lazy.get()
        if not captured:
            return FlashInferStepPlan(runner, device, batch, tokens, num_heads, max_pages, **args)
        plan = FlashInferGraphPlan(runner, device, batch, tokens, num_heads, max_pages, **args)
        plan.replan(_Lengths(qsl, lens))  # reserves FlashInfer's schedule buffers for this layout
        return plan

    @staticmethod
    def bind(plan, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, page_table: torch.Tensor):
        """The plan pointed at a step's device metadata (device work only, no sync: capturable)."""
        if isinstance(plan, MLADecodePlan):
            return dataclasses.replace(plan, query_start_loc=query_start_loc, seq_lens=seq_lens)
        return plan.bind(page_table, seq_lens)

    @staticmethod
    def run(plan, q: torch.Tensor, cache: MLACache, page_table: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor | None = None) -> torch.Tensor:
        """One layer: q [T, H, 576] bf16, out [T, H, 512] (written); no allocation, no sync."""
        if isinstance(plan, MLADecodePlan):
            return run_decode(plan, q, cache, page_table, out, lse)
        why = unsupported_reason(q, cache, page_table, out)
        if why is not None:
            raise ValueError(f"{KERNEL_NAME}: planned for FlashInfer, but {why}")
        if out.shape != (q.shape[0], q.shape[1], D_LATENT):
            raise ValueError(f"{KERNEL_NAME}: out must be [T, H, {D_LATENT}]")
        return plan.run(q, cache, out, lse)


@dataclasses.dataclass(frozen=True)
class _Lengths:
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
