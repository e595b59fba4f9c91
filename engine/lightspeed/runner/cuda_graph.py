"""CUDA-graph capture and replay of decode-only steps.

Design note. At batch 1 an eager decode step is a few hundred small kernels whose launch and
Python overhead dwarf their run time. Like vLLM and SGLang, we capture the model forward plus the
logits of single-token decode batches once per padded batch size (1, 2, 4, 8, 16, 24, 32, 48, ...)
at startup, reading static input buffers sized for the largest batch, and replay them:
- Replay copies the step's tensors into the static buffers (device to device), pads the unused rows
  so they are harmless, replays the graph of the smallest captured size >= B, and slices the logits.
- Padding rows write nothing (slot -1) and attend to the first keys of their page-table row (seq_len
  = the graph's tokens per row, 1 without speculative decoding: no query without a key; page-table rows
  hold valid page ids: zeros or a previous step's), so every row stays finite and independent.
- Attention's split-KV plan depends on shapes only: the static page table is [B, max_pages], so each
  graph's split count is fixed by its batch size and max_model_len, and the kernel masks each split
  by the seq_lens it reads from device memory, correct for any seq_len <= max_model_len.
- Kernels that plan on the host (FlashInfer's MLA decode: a plan with `replan(lengths)`) cannot have
  their schedule replayed: their plans join the graph's `HostPlans` during capture (reserved for the
  graph's batch layout, layers/attention.py), and before every replay the runner re-plans them once,
  for all layers, with the padded batch's host lengths (the plan's, then the padding rows'), exactly
  what it writes into the static seq_lens. Graphs without such kernels do no host work for it.
- Allocations inside the captured forward come from one graph memory pool shared by all sizes
  (captured largest first; graphs never run concurrently). Logits of all sizes land in one static
  fp32 buffer [max_batch, V] allocated outside the pool.
- Speculative decoding (fixed k): a second set of graphs per padded batch size (up to
  MAX_SPEC_GRAPH_ROWS rows) runs k + 1 query tokens per row. A row with fewer drafts is padded
  at its end: padding tokens write no KV (slot -1) and the row's seq_len counts them, so with the
  causal bottom-right alignment every real query still sees exactly its own prefix; their logits
  are dropped. A step whose padded row would reach past the static page table runs eagerly.
  With a device drafter the graphs also keep the hidden states (and EAGLE-3's auxiliary ones).
- Sampling stays outside the graph (it has per-request branches and host reads), except each row's
  greedy token: the graphs also write the argmax of every logits row (`greedy`, two small kernels),
  which a step whose rows are all plain greedy (no penalties, bias, min_tokens or grammar) takes as
  its sample; the eager argmax read the whole [B, V] buffer again in one block a row, 27 us a step
  at batch 1 with a 128K vocabulary. Prefill and mixed steps and batches above the largest size: eager.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..kv import KVCache
from .inputs import StepTensors, upload

log = logging.getLogger("lightspeed.runner")
# Most rows of a captured speculative step: its logits buffer holds rows * (k + 1) vocab rows.
MAX_SPEC_GRAPH_ROWS = 64


class CudaGraphRunner:
    """Decode steps of one model replayed from CUDA graphs, one per padded batch size."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, *, batch_sizes: list[int], max_model_len: int,
                 vocab_size: int, device: torch.device, spec_tokens: int = 0, keep_hidden: bool = False,
                 aux_width: int = 0):
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"CUDA graph batch sizes must be positive, got {batch_sizes}")
        self.model, self.kv_cache, self.device = model, kv_cache, device
        self.batch_sizes = sorted(set(batch_sizes))
        # Query tokens per row of each graph set: 1, and k + 1 with speculative decoding.
        self.spec_row_tokens = spec_tokens + 1 if spec_tokens else 0
        self.spec_batch_sizes = [s for s in self.batch_sizes if s <= MAX_SPEC_GRAPH_ROWS] if spec_tokens else []
        max_batch = self.batch_sizes[-1]
        max_tokens = max(max_batch, (self.spec_batch_sizes[-1] * self.spec_row_tokens) if self.spec_batch_sizes else 0)
        page_size = kv_cache.device_pool.layout.page_size
        self.page_size = page_size
        self.max_pages = -(-max_model_len // page_size)
        # Static inputs: the graphs read these addresses at every replay.
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)  # [Tmax]
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)  # [Tmax]
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)  # [Tmax], -1 = skip
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)  # [Bmax]
        # q tokens per row, so row b owns tokens [b*q, (b+1)*q): query_start_loc never changes.
        self._query_start_loc = {q: torch.arange(0, (max_batch + 1) * q, q, dtype=torch.int32, device=device)
                                 for q in {1, self.spec_row_tokens} - {0}}
        self.query_start_loc = self._query_start_loc[1]  # [Bmax+1]
        self.page_table = torch.zeros(max_batch, self.max_pages, dtype=torch.int32, device=device)  # [Bmax, P]
        self.logits = torch.zeros(max_tokens, vocab_size, dtype=torch.float32, device=device)  # [Tmax, V]
        self.greedy = torch.zeros(max_tokens, dtype=torch.int64, device=device)  # [Tmax]: argmax of each logits row
        self.last_greedy: torch.Tensor | None = None  # the last replay's greedy tokens, as its logits' rows
        hidden_size, dtype = model.config.hidden_size, model.config.torch_dtype
        self.hidden = torch.zeros(max_tokens, hidden_size, dtype=dtype, device=device) if keep_hidden else None
        self.aux = torch.zeros(max_tokens, aux_width, dtype=dtype, device=device) if aux_width else None
        self.last_hidden: torch.Tensor | None = None  # hidden states of the last replay, in plan order
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph | None] = {}  # (rows, tokens per row) -> graph
        self._host_plans: dict[tuple[int, int], object] = {}  # graph key -> its HostPlans (only when non-empty)
        self.num_replays = 0  # steps served by a graph (tests and benchmarks read it)

    # -- capture -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first (smaller graphs reuse the pool's blocks)."""
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}")
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        keys = [(s, self.spec_row_tokens) for s in self.spec_batch_sizes] + [(s, 1) for s in self.batch_sizes]
        for key in sorted(keys, key=lambda k: -k[0] * k[1]):
            self._graphs[key] = self._capture_one(key, pool)
        torch.cuda.synchronize(self.device)
        log.info("captured CUDA graphs for decode batch sizes %s%s in %.1f s", self.batch_sizes,
                 f" and {self.spec_row_tokens} tokens per row at {self.spec_batch_sizes}" if self.spec_batch_sizes
                 else "", time.perf_counter() - start)

    def _forward(self, size: int, q: int = 1, host_plans=None) -> None:
        from lightspeed_kernel import ops

        from ..layers.attention import AttentionMetadata  # as in ModelRunner: kernels load on first use

        pool = self.kv_cache.device_pool
        n = size * q
        meta = AttentionMetadata(
            query_start_loc=self._query_start_loc[q][: size + 1], seq_lens=self.seq_lens[:size],
            page_table=self.page_table[:size], slot_mapping=self.slot_mapping[:n], num_decodes=size,
            num_decode_tokens=n, max_query_len=q, kv_caches=pool.kv_caches, k_scale=pool.k_scale,
            v_scale=pool.v_scale, host_plans=host_plans)
        hidden = self.model(self.input_ids[:n], self.positions[:n], meta)
        self.logits[:n].copy_(self.model.compute_logits(hidden))
        ops.greedy(self.logits[:n], out=self.greedy[:n])
        if self.hidden is not None:
            self.hidden[:n].copy_(hidden)
        if self.aux is not None:
            self.aux[:n].copy_(self.model.model.aux_hidden_states)

    def _capture_one(self, key: tuple[int, int], pool) -> torch.cuda.CUDAGraph:
        # Warm up on a side stream first: Triton compiles, cuBLAS picks its kernels and workspaces.
        # The static inputs hold padding (slot -1), so the warm-up writes nothing into the KV cache.
        host_plans = self._start_capture(key)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(*key, host_plans)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        host_plans.capturing = True
        with torch.cuda.graph(graph, pool=pool):
            self._forward(*key, host_plans)
        self._finish_capture(key, host_plans)
        return graph

    def _start_capture(self, key: tuple[int, int]):
        """Static seq_lens as padding holds them, and the graph's (empty) HostPlans for those lengths."""
        from ..layers.attention import HostPlans

        size, q = key
        self.seq_lens[:size].fill_(q)
        return HostPlans(self._padded_lengths(key))

    def _finish_capture(self, key: tuple[int, int], host_plans) -> None:
        host_plans.capturing = False
        if host_plans:
            self._host_plans[key] = host_plans

    def _padded_lengths(self, key: tuple[int, int], plan=None, num_rows: int = 0):
        """Host lengths of a padded graph batch: the plan's first `num_rows` rows (their seq_lens, plus the
        padding tokens of rows with fewer than q), then padding rows of q tokens over q keys."""
        from lightspeed_kernel.ops import HostLengths

        size, q = key
        lens = np.full(size, q, dtype=np.int32)
        if num_rows:
            lens[:num_rows] = plan.seq_lens[:num_rows]
            if q > 1:
                lens[:num_rows] += (q - np.diff(plan.query_start_loc[: num_rows + 1])).astype(np.int32)
        return HostLengths(np.arange(size + 1, dtype=np.int32) * q, lens)

    # -- replay --------------------------------------------------------------------------------
    def _replay(self, key: tuple[int, int]) -> None:
        self._graphs[key].replay()

    def padded_size(self, num_rows: int, q: int = 1) -> int | None:
        """The smallest captured size that holds num_rows (rows of q tokens), None when none does."""
        for size in self.batch_sizes if q == 1 else self.spec_batch_sizes:
            if size >= num_rows:
                return size
        return None

    def _row_tokens(self, plan) -> int | None:
        """Tokens per row of the graph that can run this plan, or None."""
        num_rows, num_tokens = plan.req_ids.shape[0], plan.input_ids.shape[0]
        if not (plan.num_prefills == 0 and 0 < num_rows == plan.num_decodes
                and plan.page_table.shape[1] <= self.max_pages):
            return None
        if num_tokens == num_rows:
            return 1 if self.padded_size(num_rows) in self._graphs_sizes(1) else None
        q = self.spec_row_tokens
        if not q or plan.max_query_len > q or self.padded_size(num_rows, q) is None:
            return None
        # A padded row's keys must stay inside the static page table.
        if int(plan.cached_lens.max()) + q > self.max_pages * self.page_size:
            return None
        return q if (self.padded_size(num_rows, q), q) in self._graphs else None

    def _graphs_sizes(self, q: int) -> set[int]:
        return {size for size, tokens in self._graphs if tokens == q}

    def can_run(self, plan) -> bool:
        """Decode-only, within the captured sizes and page-table width; one token per row, or up
        to k + 1 with speculative graphs."""
        return self._row_tokens(plan) is not None

    def forward(self, plan, t: StepTensors) -> torch.Tensor:
        """Logits fp32 [S, V] at the plan's sampled positions (a view of the static buffer when the
        plan samples every row in order: valid until the next replay)."""
        q = self._row_tokens(plan)
        n = t.seq_lens.shape[0]
        size = self.padded_size(n, q)
        if q == 1:
            self.input_ids[:n].copy_(t.input_ids)
            self.positions[:n].copy_(t.positions)
            self.slot_mapping[:n].copy_(t.slot_mapping)
            self.seq_lens[:n].copy_(t.seq_lens)
            order = None
        else:
            # Row b's tokens go to [b*q, b*q + n_b); the rest of the row is padding.
            counts = np.diff(plan.query_start_loc)
            rows = np.repeat(np.arange(n, dtype=np.int64), counts)
            index = rows * q + np.arange(rows.shape[0], dtype=np.int64) - plan.query_start_loc[:-1].astype(np.int64)[rows]
            packed = upload(np.concatenate([index, (q - counts).astype(np.int64)]), self.device)
            order, extend = packed[: index.shape[0]], packed[index.shape[0]:]
            self.input_ids[: size * q].zero_()
            self.positions[: size * q].zero_()
            self.slot_mapping[: size * q].fill_(-1)
            self.input_ids.index_copy_(0, order, t.input_ids)
            self.positions.index_copy_(0, order, t.positions)
            self.slot_mapping.index_copy_(0, order, t.slot_mapping)
            self.seq_lens[:n].copy_(t.seq_lens + extend.to(t.seq_lens.dtype))
        self.page_table[:n, : t.page_table.shape[1]].copy_(t.page_table)
        if size > n:
            # Rows a larger step filled before: they must not write its tokens' K/V again.
            self.slot_mapping[n * q: size * q].fill_(-1)
            self.seq_lens[n:size].fill_(q)
        host_plans = self._host_plans.get((size, q))
        if host_plans is not None:  # kernels that schedule on the host: once for every layer
            host_plans.replan(self._padded_lengths((size, q), plan, n))
        self._replay((size, q))
        self.num_replays += 1
        if order is not None:
            self._keep_hidden(order)
            self.last_greedy = self.greedy.index_select(0, order)
            return self.logits.index_select(0, order)  # decode-only: every token samples, in order
        self._keep_hidden(None, n)
        indices = plan.logits_indices
        if indices.shape[0] == n and np.array_equal(indices, np.arange(n)):
            self.last_greedy = self.greedy[:n]  # a view, like the logits: valid until the next replay
            return self.logits[:n]
        self.last_greedy = self.greedy[:size].index_select(0, t.logits_indices)
        return self.logits[:size].index_select(0, t.logits_indices)

    def _keep_hidden(self, order: torch.Tensor | None, n: int = 0) -> None:
        if self.hidden is not None:
            self.last_hidden = self.hidden[:n] if order is None else self.hidden.index_select(0, order)
        if self.aux is not None:
            self.model.model.aux_hidden_states = self.aux[:n] if order is None else self.aux.index_select(0, order)


def build_cuda_graph_runner(model: torch.nn.Module, kv_cache: KVCache, *, batch_sizes: list[int],
                            max_model_len: int, vocab_size: int, device: torch.device, spec_tokens: int = 0,
                            keep_hidden: bool = False, aux_width: int = 0) -> CudaGraphRunner | None:
    """Capture decode graphs; None (eager steps) on CPU, with no sizes, or when capture fails, which
    is logged as a warning rather than stopping the engine."""
    if device.type != "cuda" or not batch_sizes:
        return None
    try:
        graphs = CudaGraphRunner(model, kv_cache, batch_sizes=batch_sizes, max_model_len=max_model_len,
                                 vocab_size=vocab_size, device=device, spec_tokens=spec_tokens,
                                 keep_hidden=keep_hidden, aux_width=aux_width)
        graphs.capture()
        return graphs
    except Exception as exc:  # any capture failure: serve eagerly, slower but correct
        log.warning("CUDA graph capture failed, running decode steps eagerly: %s: %s", type(exc).__name__, exc)
        return None
