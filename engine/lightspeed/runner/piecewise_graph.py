"""Piecewise CUDA graphs: prefill and mixed steps replayed layer by layer, attention run between.

Design note. The decode graphs (cuda_graph.py) hold whole decode-only steps. A step with a prefill
chunk runs eagerly: a few hundred module calls and kernel launches whose Python cost, for a small
model or a short chunk, is several times the GPU's work (the H200 py-spy of SmolLM2 served with
ngram_gpu at 16 conversations had a third of the engine core in eager forwards). Everything of such
a step except attention depends only on its token count, so, as vLLM does with its piecewise
graphs, it is captured per padded token count and only attention, whose launches follow the rows'
lengths, runs eagerly:

- Capture runs the model once per size with a split hook in the metadata (layers/attention.py,
  PIECEWISE_SPLIT): each attention layer stores its K/V inside the piece (the slots are a static
  buffer, padding -1) and copies its query into a static buffer, then ends the piece; its output is
  a second static buffer, so the next piece begins reading it. Both buffers are shared by every
  layer and size, so no per-layer activation outlives its piece. N layers give N + 1 graphs and N
  attention calls per size.
- Replay copies the step's tokens, positions and slots into the static buffers, then alternates:
  graph i, then layer i's `attend` on the real metadata, query buffer to output buffer. Padding
  tokens (rows past the step's count) flow through the per-token layers on stale values; nothing
  reads them back.
- Sizes: only steps the host bounds are worth it (padding costs GPU work). `auto_max_tokens` picks
  the largest token count whose GEMM work is still below an eager step's host time.
- A model whose attention layers are not `layers.attention.Attention` (MLA) never splits: capture
  notices the missing splits and the runner keeps eager steps.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from ..kv import KVCache
from ..layers.attention import PIECEWISE_SPLIT, AttentionMetadata

log = logging.getLogger("lightspeed.runner")

# Token counts captured (those up to the runner's maximum): steps between two sizes pad to the next.
TOKEN_SIZES = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
# Host time of an eager step, per layer (module calls, a dozen launches): the H200 py-spy above.
EAGER_HOST_S_PER_LAYER = 120e-6
# Dense bf16 GEMM throughput a prefill reaches on the GPUs we serve on (the H200 measures 380-400).
GEMM_FLOPS = 400e12


def auto_max_tokens(model: torch.nn.Module, num_layers: int, max_num_batched_tokens: int) -> int:
    """The most tokens a piecewise graph holds by default: the count whose GEMM work (2 FLOPs per
    weight per token) takes as long as the host spends on an eager step; above it the GPU bounds the
    step and padding to a captured size would cost more than the graphs save."""
    weights = sum(p.numel() for name, p in model.named_parameters() if "embed" not in name)
    host_bound = EAGER_HOST_S_PER_LAYER * num_layers * GEMM_FLOPS / max(2 * weights, 1)
    return int(min(max_num_batched_tokens, host_bound))


@dataclass
class _Pieces:
    """One captured size: graphs[i] runs before layers[i] attends; the last graph leaves the final
    hidden states in `hidden`."""

    graphs: list[torch.cuda.CUDAGraph]
    layers: list[torch.nn.Module]
    hidden: torch.Tensor
    aux: torch.Tensor | None


class _Recorder:
    """Cuts one forward into graphs at the attention layers (capture), or only runs it (warm-up)."""

    def __init__(self, owner: PiecewiseGraphRunner, capture: bool, pool):
        self.owner, self.capture, self.pool = owner, capture, pool
        self.graphs: list[torch.cuda.CUDAGraph] = []
        self.layers: list[torch.nn.Module] = []
        self._graph: torch.cuda.CUDAGraph | None = None

    def begin(self) -> None:
        if self.capture:
            self._graph = torch.cuda.CUDAGraph()
            self._graph.capture_begin(pool=self.pool)

    def end(self) -> None:
        if self._graph is not None:
            graph, self._graph = self._graph, None
            graph.capture_end()
            self.graphs.append(graph)

    def split(self, layer: torch.nn.Module, q: torch.Tensor) -> torch.Tensor:
        query, out = self.owner.attention_buffers(q)  # made once, in the first (warm-up) forward
        query.copy_(q)  # the last op of the piece
        self.end()
        self.layers.append(layer)
        self.begin()
        return out


class PiecewiseGraphRunner:
    """Prefill and mixed steps of up to `sizes[-1]` tokens, replayed piece by piece."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, *, sizes: list[int], num_layers: int,
                 device: torch.device):
        if not sizes or min(sizes) < 1:
            raise ValueError(f"piecewise graph token sizes must be positive, got {sizes}")
        self.model, self.kv_cache, self.device = model, kv_cache, device
        self.sizes, self.num_layers = sorted(set(sizes)), num_layers
        tmax = self.sizes[-1]
        self.input_ids = torch.zeros(tmax, dtype=torch.int64, device=device)
        self.positions = torch.zeros(tmax, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((tmax,), -1, dtype=torch.int64, device=device)
        # [tmax, Hq, D]: every layer's attention input and output, between the pieces
        self._query: torch.Tensor | None = None
        self._attn_out: torch.Tensor | None = None
        self._pieces: dict[int, _Pieces] = {}
        self.num_replays = 0

    @property
    def max_tokens(self) -> int:
        return self.sizes[-1]

    def attention_buffers(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared query and output buffers, sized for q [T, Hq, D]."""
        if self._attn_out is None:
            self._query = torch.zeros(self.max_tokens, *q.shape[1:], dtype=q.dtype, device=self.device)
            self._attn_out = torch.zeros_like(self._query)
        if tuple(self._attn_out.shape[1:]) != tuple(q.shape[1:]) or self._attn_out.dtype != q.dtype:
            raise ValueError(f"attention layers differ in shape ({tuple(q.shape[1:])} vs "
                             f"{tuple(self._attn_out.shape[1:])}): one shared buffer cannot serve them")
        n = q.shape[0]
        return self._query[:n], self._attn_out[:n]

    # -- capture -------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every size, largest first (smaller ones reuse the pool's blocks)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for size in reversed(self.sizes):
                self._run(size, capture=False, pool=None)  # Triton compiles, cuBLAS picks its kernels
                self._pieces[size] = self._run(size, capture=True, pool=pool)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        log.info("captured piecewise CUDA graphs for prefill and mixed steps of %s tokens in %.1f s",
                 self.sizes, time.perf_counter() - start)

    def _run(self, size: int, *, capture: bool, pool) -> _Pieces:
        pool_kv = self.kv_cache.device_pool
        recorder = _Recorder(self, capture, pool)
        dummy = torch.zeros(2, dtype=torch.int32, device=self.device)
        meta = AttentionMetadata(
            query_start_loc=dummy, seq_lens=dummy[:1], page_table=dummy[:1].view(1, 1),
            slot_mapping=self.slot_mapping[:size], num_decodes=0, num_decode_tokens=0, max_query_len=size,
            kv_caches=pool_kv.kv_caches, k_scale=pool_kv.k_scale, v_scale=pool_kv.v_scale)
        meta.scratch[PIECEWISE_SPLIT] = recorder.split
        recorder.begin()
        try:
            hidden = self.model(self.input_ids[:size], self.positions[:size], meta)
        finally:
            recorder.end()  # a failed capture must not leave the stream capturing
        if len(recorder.layers) != self.num_layers:
            raise ValueError(f"{len(recorder.layers)} of {self.num_layers} layers split at their attention "
                             "(their attention is not layers.attention.Attention)")
        aux = getattr(getattr(self.model, "model", None), "aux_hidden_states", None)
        return _Pieces(recorder.graphs, recorder.layers, hidden, aux)

    # -- replay --------------------------------------------------------------------------------
    def padded_size(self, num_tokens: int) -> int | None:
        for size in self.sizes:
            if size >= num_tokens:
                return size
        return None

    def can_run(self, plan) -> bool:
        n = plan.input_ids.shape[0]
        return n > 0 and self.padded_size(n) in self._pieces

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [T, H] of the step (a view of the graphs' output: valid until the next replay)."""
        n = input_ids.shape[0]
        size = self.padded_size(n)
        pieces = self._pieces[size]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        if size > n:
            self.slot_mapping[n:size].fill_(-1)  # padding writes no K/V
        query, out = self._query[:n], self._attn_out[:n]
        for i, graph in enumerate(pieces.graphs):
            graph.replay()
            if i < len(pieces.layers):
                pieces.layers[i].attend(query, meta, out=out)
        self.num_replays += 1
        if pieces.aux is not None:
            self.model.model.aux_hidden_states = pieces.aux[:n]
        return pieces.hidden[:n]


def build_piecewise_graph_runner(model: torch.nn.Module, kv_cache: KVCache, *, max_tokens: int, num_layers: int,
                                 device: torch.device) -> PiecewiseGraphRunner | None:
    """Capture piecewise graphs up to `max_tokens` tokens; None (eager prefill steps) on CPU, below the
    smallest size, or when capture fails, which is logged rather than stopping the engine."""
    sizes = [s for s in TOKEN_SIZES if s <= max_tokens]
    if device.type != "cuda" or not sizes:
        return None
    try:
        runner = PiecewiseGraphRunner(model, kv_cache, sizes=sizes, num_layers=num_layers, device=device)
        runner.capture()
        return runner
    except Exception as exc:  # any capture failure: prefill steps run eagerly, slower but correct
        log.warning("piecewise CUDA graph capture failed, prefill and mixed steps run eagerly: %s: %s",
                    type(exc).__name__, exc)
        return None
