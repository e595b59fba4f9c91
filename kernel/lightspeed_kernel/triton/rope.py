"""Rotary embedding (neox and gptj layouts, partial rotary), in place on q and k.

One program per token: cos/sin for the token's position are read once and applied to every q and
k head of that token. Only the first `rot_dim` features of each head are touched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check, check_dtype, pdl_args, pdl_enter, register


@triton.jit
def _rotate_heads(
    ptr,
    stride_t,
    stride_h,
    tok,
    n_heads,
    cos,
    sin,
    IS_NEOX: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    i = tl.arange(0, BLOCK_R)
    imask = i < HALF
    if IS_NEOX:  # pairs (i, i + rot/2)
        first = i
        second = i + HALF
    else:  # pairs (2i, 2i + 1)
        first = 2 * i
        second = 2 * i + 1
    for h0 in range(0, n_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        mask = (heads < n_heads)[:, None] & imask[None, :]
        base = ptr + tok * stride_t + heads[:, None] * stride_h
        x1 = tl.load(base + first[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + second[None, :], mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * cos[None, :] - x2 * sin[None, :]
        o2 = x2 * cos[None, :] + x1 * sin[None, :]
        tl.store(base + first[None, :], o1.to(ptr.dtype.element_ty), mask=mask)
        tl.store(base + second[None, :], o2.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    n_q_heads,
    n_k_heads,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    IS_NEOX: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok)
    i = tl.arange(0, BLOCK_R)
    imask = i < HALF
    cos = tl.load(cache_ptr + pos * stride_cache + i, mask=imask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + i, mask=imask, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, tok, n_q_heads, cos, sin, IS_NEOX, HALF, BLOCK_HQ, BLOCK_R)
    _rotate_heads(k_ptr, stride_kt, stride_kh, tok, n_k_heads, cos, sin, IS_NEOX, HALF, BLOCK_HK, BLOCK_R)


@register("rope", "rotary", "triton_rope", FLOAT_DTYPES)
def apply_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
):
    """Rotate q: [T, Hq, D] and k: [T, Hkv, D] in place by positions: int64 [T].

    cos_sin_cache: [max_pos, rot_dim] (cos half ‖ sin half); the first rot_dim features of each head
    rotate (partial rotary when rot_dim < D). Returns (q, k), the same tensors.
    """
    check(q.dim() == 3 and k.dim() == 3, "q and k must be [T, H, D]")
    t, hq, d = q.shape
    check(k.shape[0] == t and k.shape[2] == d, "k must be [T, Hkv, D] with q's T and D")
    check(positions.shape == (t,), f"positions must be [{t}]")
    check_dtype("q", q, FLOAT_DTYPES)
    check(k.dtype == q.dtype, "q and k dtypes differ")
    check(
        cos_sin_cache.dim() == 2 and cos_sin_cache.stride(1) == 1, "cos_sin_cache must be [max_pos, rot_dim]"
    )
    rot = cos_sin_cache.shape[1]
    check(rot % 2 == 0 and rot <= d, f"rot_dim {rot} must be even and <= head dim {d}")
    check(q.stride(2) == 1 and k.stride(2) == 1, "q, k: last dim must be contiguous")
    if t == 0:
        return q, k
    half = rot // 2
    block_r = triton.next_power_of_2(half)
    hk = k.shape[1]
    block_hq = max(1, min(triton.next_power_of_2(hq), 4096 // block_r))
    block_hk = max(1, min(triton.next_power_of_2(hk), 4096 // block_r))
    _rope_kernel[(t,)](
        positions,
        q,
        k,
        cos_sin_cache,
        hq,
        hk,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos_sin_cache.stride(0),
        IS_NEOX=bool(is_neox),
        HALF=half,
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        BLOCK_R=block_r,
        num_warps=4,
        **pdl_args(q.device),
    )
    return q, k
