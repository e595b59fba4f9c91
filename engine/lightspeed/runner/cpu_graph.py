"""Decode steps on the CPU replayed from native graphs (lightspeed_kernel.cpu.graph).

Design note. With quantised weights on the native kernels, an eager CPU decode step of a small
model spends about as long in Python (module calls, op dispatch, launcher checks) as in its
kernels. The step's kernel calls depend only on the batch size, so, exactly like the CUDA graph
runner (cuda_graph.py, whose static buffers, padding and `forward` this reuses), the forward of
each padded decode batch size is recorded once at startup and replayed with the step's inputs
copied into static buffers. A size whose forward is not all native kernels (float weights on
torch's GEMM, a dtype the native kernels do not take, more rows than the fused quantised GEMM
serves) fails its capture and runs eagerly; the log says which and why.
"""

from __future__ import annotations

import logging
import time

import torch

from ..kv import KVCache
from .cuda_graph import CudaGraphRunner

log = logging.getLogger("lightspeed.runner")

# Decode batches above this run eagerly: from DENSE_MIN_ROWS (lightspeed_kernel.cpu.gemm) rows on the
# quantised GEMM hands the product to torch's GEMM, which a native graph cannot replay.
MAX_CPU_GRAPH_BATCH = 16


class CpuGraphRunner(CudaGraphRunner):
    """Decode steps of one model replayed from native CPU graphs, one per padded batch size."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, *, batch_sizes: list[int], max_model_len: int,
                 vocab_size: int, device: torch.device):
        super().__init__(model, kv_cache, batch_sizes=batch_sizes, max_model_len=max_model_len,
                         vocab_size=vocab_size, device=device)
        self._outputs: dict[int, torch.Tensor] = {}  # size -> the logits tensor its graph writes

    @torch.inference_mode()
    def capture(self) -> None:
        from lightspeed_kernel.cpu.graph import GraphCaptureError, record

        start = time.perf_counter()
        self._forward_logits(self.batch_sizes[0])  # warm-up: every kernel selected and loaded
        for size in self.batch_sizes:
            try:
                with record() as graph:
                    logits = self._forward_logits(size)
            except GraphCaptureError as e:
                log.info("decode batches of %d and more run eagerly on the CPU: %s", size, e)
                break  # a forward that is not all native kernels is so at every size
            self._graphs[size, 1], self._outputs[size] = graph, logits
        if self._graphs:
            log.info("recorded native CPU graphs for decode batch sizes %s (%d calls at batch 1) in %.2f s",
                     sorted(self._graphs_sizes(1)), len(self._graphs[min(self._graphs)]),
                     time.perf_counter() - start)

    def _forward_logits(self, size: int) -> torch.Tensor:
        from ..layers.attention import AttentionMetadata

        pool = self.kv_cache.device_pool
        meta = AttentionMetadata(
            query_start_loc=self.query_start_loc[: size + 1], seq_lens=self.seq_lens[:size],
            page_table=self.page_table[:size], slot_mapping=self.slot_mapping[:size], num_decodes=size,
            num_decode_tokens=size, max_query_len=1, kv_caches=pool.kv_caches, k_scale=pool.k_scale,
            v_scale=pool.v_scale)
        hidden = self.model(self.input_ids[:size], self.positions[:size], meta)
        return self.model.compute_logits(hidden)

    def _replay(self, key: tuple[int, int]) -> None:
        size, _ = key  # one token per row: speculative steps are never recorded (they run eagerly)
        self._graphs[key].replay()
        self.logits[:size].copy_(self._outputs[size])
        torch.argmax(self.logits[:size], dim=-1, out=self.greedy[:size])  # what the CUDA graphs compute inside


def build_cpu_graph_runner(model: torch.nn.Module, kv_cache: KVCache, *, batch_sizes: list[int],
                           max_model_len: int, vocab_size: int, device: torch.device,
                           quantized: bool = True) -> CpuGraphRunner | None:
    """Record decode graphs on the CPU; None (eager steps) without native kernels, for float weights
    (torch's GEMM: nothing a native graph replays, so no capture is attempted), with no sizes, or
    when no size could be recorded."""
    from lightspeed_kernel.cpu import NATIVE_AVAILABLE

    sizes = [s for s in batch_sizes if s <= MAX_CPU_GRAPH_BATCH]
    if device.type != "cpu" or not sizes or not NATIVE_AVAILABLE or not quantized:
        return None
    graphs = CpuGraphRunner(model, kv_cache, batch_sizes=sizes, max_model_len=max_model_len, vocab_size=vocab_size,
                            device=device)
    graphs.capture()
    return graphs if graphs._graphs else None
