"""CUDA-graph capture and replay of decode-only steps.

Design note. At batch 1 an eager decode step is a few hundred small kernels whose launch and
Python overhead dwarf their run time. Like vLLM and SGLang, we capture the model forward plus the
logits of single-token decode batches once per padded batch size (1, 2, 4, 8, 16, 24, 32, 48, ...)
at startup, reading static input buffers sized for the largest batch, and replay them:
- Replay copies the step's tensors into the static buffers (device to device), pads the unused rows
  so they are harmless, replays the graph of the smallest captured size >= B, and slices the logits.
- Padding rows write nothing (slot -1) and attend to one key of page 0 (seq_len 1, page-table rows
  hold valid page ids: zeros or a previous step's), so every row stays finite and independent.
- Attention's split-KV plan depends on shapes only: the static page table is [B, max_pages], so each
  graph's split count is fixed by its batch size and max_model_len, and the kernel masks each split
  by the seq_lens it reads from device memory, correct for any seq_len <= max_model_len.
- Allocations inside the captured forward come from one graph memory pool shared by all sizes
  (captured largest first; graphs never run concurrently). Logits of all sizes land in one static
  fp32 buffer [max_batch, V] allocated outside the pool.
- Sampling stays outside the graph (it has per-request branches and host reads); so do prefill and
  mixed steps, speculative (multi-token) decodes and batches above the largest size: eager.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..kv import KVCache
from .inputs import StepTensors

log = logging.getLogger("lightspeed.runner")


class CudaGraphRunner:
    """Decode steps of one model replayed from CUDA graphs, one per padded batch size."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, *, batch_sizes: list[int], max_model_len: int,
                 vocab_size: int, device: torch.device):
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f"CUDA graph batch sizes must be positive, got {batch_sizes}")
        self.model, self.kv_cache, self.device = model, kv_cache, device
        self.batch_sizes = sorted(set(batch_sizes))
        max_batch = self.batch_sizes[-1]
        page_size = kv_cache.device_pool.layout.page_size
        self.max_pages = -(-max_model_len // page_size)
        # Static inputs: the graphs read these addresses at every replay.
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=device)  # [Bmax]
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=device)  # [Bmax]
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=device)  # [Bmax], -1 = skip
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)  # [Bmax]
        # One token per row, so row b owns token b: query_start_loc never changes.
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)  # [Bmax+1]
        self.page_table = torch.zeros(max_batch, self.max_pages, dtype=torch.int32, device=device)  # [Bmax, P]
        self.logits = torch.zeros(max_batch, vocab_size, dtype=torch.float32, device=device)  # [Bmax, V]
        self._graphs: dict[int, torch.cuda.CUDAGraph | None] = {}  # captured size -> graph
        self.num_replays = 0  # steps served by a graph (tests and benchmarks read it)

    # -- capture -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first (smaller graphs reuse the pool's blocks)."""
        if self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {self.device}")
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.batch_sizes):
            self._graphs[size] = self._capture_one(size, pool)
        torch.cuda.synchronize(self.device)
        log.info("captured CUDA graphs for decode batch sizes %s in %.1f s", self.batch_sizes,
                 time.perf_counter() - start)

    def _forward(self, size: int) -> None:
        from ..layers.attention import AttentionMetadata  # as in ModelRunner: kernels load on first use

        pool = self.kv_cache.device_pool
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1], seq_lens=self.seq_lens[:size],
            page_table=self.page_table[:size], slot_mapping=self.slot_mapping[:size], num_decodes=size,
            num_decode_tokens=size, max_query_len=1, kv_caches=pool.kv_caches, k_scale=pool.k_scale,
            v_scale=pool.v_scale)
        hidden = self.model(self.input_ids[:size], self.positions[:size], meta)
        self.logits[:size].copy_(self.model.compute_logits(hidden))

    def _capture_one(self, size: int, pool) -> torch.cuda.CUDAGraph:
        # Warm up on a side stream first: Triton compiles, cuBLAS picks its kernels and workspaces.
        # The static inputs hold padding (slot -1), so the warm-up writes nothing into the KV cache.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(size)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._forward(size)
        return graph

    # -- replay --------------------------------------------------------------------------------
    def _replay(self, size: int) -> None:
        self._graphs[size].replay()

    def padded_size(self, num_rows: int) -> int | None:
        """The smallest captured size that holds num_rows, None when none does."""
        for size in self.batch_sizes:
            if size >= num_rows:
                return size
        return None

    def can_run(self, plan) -> bool:
        """Decode-only, one token per request, within the captured sizes and page-table width."""
        num_rows = plan.req_ids.shape[0]
        return (plan.num_prefills == 0 and 0 < num_rows == plan.num_decodes == plan.input_ids.shape[0]
                and plan.page_table.shape[1] <= self.max_pages and self.padded_size(num_rows) in self._graphs)

    def forward(self, plan, t: StepTensors) -> torch.Tensor:
        """Logits fp32 [S, V] at the plan's sampled positions (a view of the static buffer when the
        plan samples every row in order: valid until the next replay)."""
        n = t.input_ids.shape[0]
        size = self.padded_size(n)
        self.input_ids[:n].copy_(t.input_ids)
        self.positions[:n].copy_(t.positions)
        self.slot_mapping[:n].copy_(t.slot_mapping)
        self.seq_lens[:n].copy_(t.seq_lens)
        self.page_table[:n, : t.page_table.shape[1]].copy_(t.page_table)
        if size > n:
            # Rows a larger step filled before: they must not write its tokens' K/V again.
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)
        self._replay(size)
        self.num_replays += 1
        indices = plan.logits_indices
        if indices.shape[0] == n and np.array_equal(indices, np.arange(n)):
            return self.logits[:n]
        return self.logits[:size].index_select(0, t.logits_indices)


def build_cuda_graph_runner(model: torch.nn.Module, kv_cache: KVCache, *, batch_sizes: list[int],
                            max_model_len: int, vocab_size: int, device: torch.device) -> CudaGraphRunner | None:
    """Capture decode graphs; None (eager steps) on CPU, with no sizes, or when capture fails, which
    is logged as a warning rather than stopping the engine."""
    if device.type != "cuda" or not batch_sizes:
        return None
    try:
        graphs = CudaGraphRunner(model, kv_cache, batch_sizes=batch_sizes, max_model_len=max_model_len,
                                 vocab_size=vocab_size, device=device)
        graphs.capture()
        return graphs
    except Exception as exc:  # any capture failure: serve eagerly, slower but correct
        log.warning("CUDA graph capture failed, running decode steps eagerly: %s: %s", type(exc).__name__, exc)
        return None
