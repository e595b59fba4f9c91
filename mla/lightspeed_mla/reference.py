"""Plain-torch MLA attention references: the ground truth on CPU and GPU.

Masking convention (both forms): request b has ``q_len_b`` new query tokens and ``kv_len_b`` keys,
the new tokens being the last ``q_len_b`` of the keys (bottom-right causal alignment). Query i of
the request (0-based) sees keys ``0 .. kv_len_b - q_len_b + i``.

LSE outputs are natural-log ``logsumexp(softmax_scale * scores)`` in fp32, [T, H].
"""

from __future__ import annotations

import torch

from .cache import D_LATENT, MLACache


def _causal_mask(q_len: int, kv_len: int, device) -> torch.Tensor:
    # mask: [q_len, kv_len], True where the query may look.
    q_pos = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return torch.arange(kv_len, device=device)[None, :] <= q_pos


def gather_latent_reference(cache: MLACache, page_row: torch.Tensor, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's cached tokens in fp32: (latent [kv_len, 512], rope [kv_len, 64])."""
    pos = torch.arange(kv_len, device=page_row.device)
    pages = page_row[pos // cache.page_size].long()
    offs = pos % cache.page_size
    latent = cache.latent[pages, offs].float()
    if cache.scale is not None:
        latent = latent * cache.scale[pages, offs]
    return latent, cache.rope[pages, offs].float()


def quantize_q_latent_e4m3(q: torch.Tensor) -> torch.Tensor:
    """Q as the e4m3-score decode kernels see it (`mla_decode_sm90` with fp8_scores): each row's 512
    latent values times 448 / amax, rounded to e4m3, times amax / 448; the 64 rope values unchanged.
    q: [..., 576] -> fp32 [..., 576].

    The multiplier is a true fp32 division, as the kernel computes it. `448.0 / amax` (a Python number
    over a tensor) is a reciprocal times 448 in torch, one ulp off for many amax; since x * (448 / amax)
    often lands exactly halfway between two e4m3 values, that ulp flipped ~5% of a row's bytes and made
    a correct kernel look 1-3% off in S (found on the H100, 2026-12-06)."""
    lat = q[..., :D_LATENT].float()
    amax = lat.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 448.0) / amax, torch.zeros_like(amax))
    q8 = (lat * inv).clamp(-448, 448).to(torch.float8_e4m3fn).float() * (amax / 448.0)
    return torch.cat([q8, q[..., D_LATENT:].float()], dim=-1)


def mla_decode_reference(
    q: torch.Tensor,
    cache: MLACache,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    softmax_scale: float,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA attention over a paged latent cache.

    q: [T, H, 576] ([q_latent | q_rope]); page_table: [B, max_pages]; seq_lens: [B] keys per request
    (new tokens included, already stored in the cache); query_start_loc: [B+1].
    Returns out [T, H, 512] in q's dtype and lse [T, H] fp32.
    """
    T, H, _ = q.shape
    out = torch.zeros(T, H, D_LATENT, dtype=compute_dtype, device=q.device)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(seq_lens.shape[0]):
        q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
        kv_len = int(seq_lens[b])
        if q1 == q0:
            continue
        latent, rope = gather_latent_reference(cache, page_table[b], kv_len)
        k = torch.cat([latent, rope], dim=-1).to(compute_dtype)  # [L, 576]
        qb = q[q0:q1].to(compute_dtype)  # [n, H, 576]
        scores = torch.einsum("nhd,ld->hnl", qb, k) * softmax_scale
        scores = scores.masked_fill(~_causal_mask(q1 - q0, kv_len, q.device)[None], float("-inf"))
        lse_b = torch.logsumexp(scores, dim=-1)  # [H, n]
        probs = torch.exp(scores - lse_b[..., None]).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hnl,ld->nhd", probs, latent.to(compute_dtype))
        lse[q0:q1] = lse_b.transpose(0, 1).float()
    return out.to(q.dtype), lse


def mla_prefill_reference(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softmax_scale: float,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-absorbed MLA prefill attention over ragged requests.

    q_nope: [T, H, Dn]; q_rope: [T, H, Dr]; k_nope: [Tk, H, Dn]; k_rope: [Tk, Dr] (one rope key
    shared by all heads, as MLA has it); v: [Tk, H, Dv]; cu_seqlens_q / cu_seqlens_k: [B+1].
    Request b's keys are its cached prefix followed by its new tokens.
    Returns out [T, H, Dv] in q's dtype and lse [T, H] fp32.
    """
    T, H, _ = q_nope.shape
    out = torch.zeros(T, H, v.shape[-1], dtype=compute_dtype, device=q_nope.device)
    lse = torch.full((T, H), float("-inf"), dtype=torch.float32, device=q_nope.device)
    for b in range(cu_seqlens_q.shape[0] - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0:
            continue
        c = compute_dtype
        scores = torch.einsum("nhd,lhd->hnl", q_nope[q0:q1].to(c), k_nope[k0:k1].to(c))
        scores = scores + torch.einsum("nhd,ld->hnl", q_rope[q0:q1].to(c), k_rope[k0:k1].to(c))
        scores = scores * softmax_scale
        scores = scores.masked_fill(~_causal_mask(q1 - q0, k1 - k0, q_nope.device)[None], float("-inf"))
        lse_b = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse_b[..., None]).nan_to_num(0.0)
        out[q0:q1] = torch.einsum("hnl,lhd->nhd", probs, v[k0:k1].to(c))
        lse[q0:q1] = lse_b.transpose(0, 1).float()
    return out.to(q_nope.dtype), lse
