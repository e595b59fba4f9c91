"""Paged attention over the KV cache, and the per-step metadata every attention layer reads.

A batch holds decode rows first (1..16 query tokens each, e.g. speculative drafts), then prefill
rows (a chunk of a prompt, possibly after a cached prefix). Each layer writes the K/V of all new
tokens into its cache first, then runs the decode kernel on the decode rows and the prefill
kernel on the rest, each seeing its new tokens as the last `q_len` tokens of its sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from lightspeed_kernel import ops
from torch import nn

# AttentionMetadata.scratch key of the piecewise CUDA-graph capture's split (runner/piecewise_graph.py):
# `split(layer, q) -> out`, called where the layer's attention would run.
PIECEWISE_SPLIT = "piecewise_split"


def decode_query_bound(plan) -> int:
    """Tokens of the longest decode row of a host plan (0 without decode rows): 1 unless rows carry
    speculative drafts, then read from the plan's query_start_loc (host memory, no sync)."""
    nd, ndt = int(plan.num_decodes), int(plan.num_decode_tokens)
    if nd == 0 or ndt == nd:
        return min(nd, 1)
    qsl = np.asarray(plan.query_start_loc[: nd + 1])
    return int(np.diff(qsl).max())


class HostPlans:
    """The host-planned kernel plans of one captured CUDA graph (`AttentionMetadata.host_plans`).

    A graph replays a plan's device work; a plan with `replan(lengths)` (FlashInfer's MLA decode) also
    has a host side, the schedule of the step's lengths, which the graph cannot replay. The runner calls
    `replan` with each step's padded host lengths before the replay, once for all layers. `lengths` is
    what the runner's static buffers hold while it warms up and captures: a plan joining outside the
    capture is planned for them at once (the warm-up runs for real), one joining inside it is not (its
    host-to-device copies would be recorded into the graph and replayed over later plans).
    """

    def __init__(self, lengths: ops.HostLengths):
        self.lengths = lengths
        self.capturing = False  # set by the runner around the captured forward
        self.plans: list[Any] = []

    def add(self, plan) -> None:
        if not any(p is plan for p in self.plans):
            self.plans.append(plan)
        if not self.capturing:
            plan.replan(self.lengths)

    def replan(self, lengths: ops.HostLengths) -> None:
        for plan in self.plans:
            plan.replan(lengths)

    def __bool__(self) -> bool:
        return bool(self.plans)


@dataclass
class AttentionMetadata:
    """What the runner hands every attention layer for one forward step.

    Decode rows come first: rows `[:num_decodes]` own tokens `[:num_decode_tokens]`.
    """

    query_start_loc: torch.Tensor  # int32 [B+1]: row b owns tokens [qsl[b], qsl[b+1])
    seq_lens: torch.Tensor  # int32 [B]: tokens in the cache after this step, new ones included
    page_table: torch.Tensor  # int32 [B, P]: page ids of each row's sequence, in order
    slot_mapping: torch.Tensor  # int64 [T]: page·page_size + offset of each new token; -1 = skip
    num_decodes: int  # decode rows (first in the batch)
    num_decode_tokens: int  # tokens of the decode rows (first in the batch)
    max_query_len: int  # longest row's new-token count (an upper bound is fine)
    # Per layer, what the pool holds: (k, v) `[num_pages, page_size, Hkv, D]` for MHA pools, a
    # `lightspeed_mla.MLACache` for MLA pools (the model's attention layer knows which it reads).
    kv_caches: Sequence[Any]
    k_scale: torch.Tensor | float | None = None  # fp8 caches: stored value = k / k_scale
    v_scale: torch.Tensor | float | None = None
    # Longest decode row's token count (1 + its drafts with speculative decoding), from the host plan
    # (`decode_query_bound`); None: bounded by max_query_len and the decode token count.
    max_decode_query_len: int | None = None
    # query_start_loc / seq_lens on the host (the scheduler's plan), for kernels that plan on the host
    # (FlashInfer, torch-SDPA split prefill): without them they copy the device tensors back, a copy
    # that waits for the step still running ahead of this one. None: not known (CUDA-graph capture).
    host_query_start_loc: np.ndarray | None = None
    host_seq_lens: np.ndarray | None = None
    # Set by a CUDA-graph runner while it captures a graph: plans that schedule on the host go there
    # (`plan_on_host`), and the runner re-plans them before every replay. None: planned in the step.
    host_plans: HostPlans | None = None
    # Prefill rows' query_start_loc rebased to 0, computed once per step (not per layer).
    _prefill_query_start_loc: torch.Tensor | None = field(default=None, repr=False)
    # What attention layers derive once per step and share (e.g. MLA's decode plan, gather indices).
    scratch: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def decode_query_len(self) -> int:
        """Upper bound on one decode row's tokens, known without a device sync. Every decode row has
        >= 1 token, so none exceeds num_decode_tokens - (num_decodes - 1); the host plan's exact
        figure is tighter when decode rows carry drafts beside a prefill (that bound alone can pass
        the decode kernels' limit of query tokens per row)."""
        bound = min(self.max_query_len, self.num_decode_tokens - self.num_decodes + 1)
        return bound if self.max_decode_query_len is None else min(bound, self.max_decode_query_len)

    @property
    def num_prefills(self) -> int:
        return self.seq_lens.shape[0] - self.num_decodes

    def host_lengths(self, part: str) -> ops.HostLengths | None:
        """The host lengths of the decode rows ("decode") or the prefill rows ("prefill"), laid out
        as the kernel of that part sees them (prefill starts rebased to 0); one slice per step."""
        if self.host_query_start_loc is None or self.host_seq_lens is None:
            return None
        key = ("host_lengths", part)
        if key not in self.scratch:
            nd, qsl, lens = self.num_decodes, self.host_query_start_loc, self.host_seq_lens
            if part == "decode":
                self.scratch[key] = ops.HostLengths(qsl[: nd + 1], lens[:nd])
            else:
                self.scratch[key] = ops.HostLengths(qsl[nd:] - self.num_decode_tokens, lens[nd:])
        return self.scratch[key]

    def plan_on_host(self, plan, rows: int) -> None:
        """Have a host-planned kernel plan (one with `replan(lengths)`, e.g. FlashInfer's MLA decode) cover
        this step's first `rows` rows: planned now from the host lengths, or, for a caller that has none,
        from the device tensors read back (a sync); under a CUDA-graph capture, kept for the runner."""
        if self.host_plans is not None:
            self.host_plans.add(plan)
            return
        if self.host_query_start_loc is not None and self.host_seq_lens is not None:
            qsl, lens = self.host_query_start_loc[: rows + 1], self.host_seq_lens[:rows]
        else:
            qsl, lens = self.query_start_loc[: rows + 1].cpu().numpy(), self.seq_lens[:rows].cpu().numpy()
        plan.replan(ops.HostLengths(qsl, lens))

    def prefill_query_start_loc(self) -> torch.Tensor:
        if self._prefill_query_start_loc is None:
            self._prefill_query_start_loc = self.query_start_loc[self.num_decodes:] - self.num_decode_tokens
        return self._prefill_query_start_loc


class Attention(nn.Module):
    """Multi-head / grouped-query attention of one layer over its paged KV cache.

    forward(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], meta) -> [T, Hq, D]. Heads are this
    rank's heads (the projections are already tensor-parallel); placement Shard(heads) → same.
    """

    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, layer_idx: int,
                 scale: float | None = None, soft_cap: float | None = None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not group over {num_kv_heads} KV heads")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.layer_idx = layer_idx
        self.scale = head_dim**-0.5 if scale is None else scale
        self.soft_cap = soft_cap

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                rotary=None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """`rotary` (a RotaryEmbedding) with `positions`: q and k are not yet rotated; the rotation
        runs fused with the KV store (one kernel per layer, k never written back)."""
        k_cache, v_cache = meta.kv_caches[self.layer_idx]
        if rotary is None:
            ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale=meta.k_scale, v_scale=meta.v_scale)
        else:
            q = ops.rope_store_kv(positions, q, k, v, rotary.cos_sin_cache, k_cache, v_cache, meta.slot_mapping,
                                  is_neox=rotary.is_neox, k_scale=meta.k_scale, v_scale=meta.v_scale)
        split = meta.scratch.get(PIECEWISE_SPLIT)
        if split is not None:  # piecewise CUDA-graph capture: the attention itself runs between pieces
            return split(self, q)
        return self.attend(q, meta)

    def attend(self, q: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """The attention of q [T, Hq, D] over this layer's cache (its K/V already stored) -> [T, Hq, D],
        into `out` when given."""
        k_cache, v_cache = meta.kv_caches[self.layer_idx]
        nd, ndt = meta.num_decodes, meta.num_decode_tokens
        common = dict(scale=self.scale, soft_cap=self.soft_cap, k_scale=meta.k_scale, v_scale=meta.v_scale)
        if meta.num_prefills == 0:
            return self._decode(q, k_cache, v_cache, meta, common, out=out)
        host = meta.host_lengths("prefill")
        if nd == 0:
            return ops.attention_prefill(q, k_cache, v_cache, meta.page_table, meta.query_start_loc,
                                         meta.seq_lens, max_query_len=meta.max_query_len, host_lengths=host,
                                         out=out, **common)
        out = torch.empty_like(q) if out is None else out
        self._decode(q[:ndt], k_cache, v_cache, meta, common, out=out[:ndt])
        ops.attention_prefill(q[ndt:], k_cache, v_cache, meta.page_table[nd:], meta.prefill_query_start_loc(),
                              meta.seq_lens[nd:], max_query_len=meta.max_query_len, out=out[ndt:],
                              host_lengths=host, **common)
        return out

    @staticmethod
    def _decode(q, k_cache, v_cache, meta: AttentionMetadata, common: dict, out=None) -> torch.Tensor:
        nd = meta.num_decodes
        return ops.attention_decode(q, k_cache, v_cache, meta.page_table[:nd], meta.query_start_loc[: nd + 1],
                                    meta.seq_lens[:nd], max_query_len=meta.decode_query_len, out=out,
                                    host_lengths=meta.host_lengths("decode"), **common)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, layer={self.layer_idx}"
