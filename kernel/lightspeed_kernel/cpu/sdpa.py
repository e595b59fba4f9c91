"""Paged prefill attention on the CPU through torch's fused attention (scaled_dot_product_attention,
its flash-attention CPU kernel), one request at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..reference.attention import _check, host_or_device_lengths
from ..registry import Priority, register_kernel


def _gather(cache: torch.Tensor, pages: torch.Tensor, seq_len: int, scale) -> torch.Tensor:
    # cache: [num_pages, page_size, Hkv, D]; pages: [n] -> [Hkv, seq_len, D]
    rows = cache[pages].flatten(0, 1)[:seq_len]
    if scale is not None:
        rows = rows.float() * scale
    return rows.permute(1, 0, 2)


@register_kernel("attention", "prefill", name="sdpa_prefill", solution="torch", priority=Priority.PORTABLE,
                 capability="cpu", dtypes=(torch.float32, torch.bfloat16, torch.float16))
def attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    scale: float,
    soft_cap: float | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    out: torch.Tensor | None = None,
    host_lengths=None,
) -> torch.Tensor:
    # q: [T, Hq, D]; caches: [num_pages, page_size, Hkv, D]; page_table: int32 [B, P] -> [T, Hq, D].
    # Per request: its pages gathered (K/V of one request, small beside the attention itself), then
    # torch's fused CPU attention with the causal mask aligned bottom-right (a cached prefix before
    # the new tokens). No soft cap (not requested as a feature) and no fp8 caches.
    _check(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    out = torch.empty_like(q) if out is None else out
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    starts, lens = host_or_device_lengths(query_start_loc, seq_lens, host_lengths)
    for b, seq_len in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        pages = page_table[b, : -(-seq_len // page_size)].long()
        k = _gather(k_cache, pages, seq_len, k_scale).to(q.dtype)
        v = _gather(v_cache, pages, seq_len, v_scale).to(q.dtype)
        qh = q[q_start:q_end].transpose(0, 1)  # [Hq, q_len, D]
        if q_len == seq_len:
            attended = F.scaled_dot_product_attention(qh[None], k[None], v[None], is_causal=True, scale=scale,
                                                      enable_gqa=group > 1)
        else:
            visible = torch.ones(q_len, seq_len, dtype=torch.bool).tril_(seq_len - q_len)
            attended = F.scaled_dot_product_attention(qh[None], k[None], v[None], attn_mask=visible, scale=scale,
                                                      enable_gqa=group > 1)
        out[q_start:q_end] = attended[0].transpose(0, 1)
    return out
