"""Write the K/V of new tokens into the paged cache by slot_mapping (slot = page * page_size + offset).

One program per token copies all of its heads for K and V; slot -1 skips the token. An fp8 cache
stores k / k_scale, saturated to the format's finite range.

`rope_store_kv` fuses the rotary embedding in: per token, q is rotated in place (as `apply_rope`
does) and k is rotated in registers on its way into the cache, so a decode layer launches one
kernel instead of two and k is never written back to the activations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, FP8_DTYPES, check, check_dtype, pdl_args, pdl_enter, register, scale_tensor
from .rope import _rotate_heads


@triton.jit
def _store_one(
    src_ptr,
    cache_ptr,
    tok,
    slot,
    stride_st,
    stride_sh,
    stride_cp,
    stride_co,
    stride_ch,
    page_size,
    n_heads,
    head_dim,
    scale_ptr,
    HAS_SCALE: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # the source load does not depend on the slot: it is issued while the slot is still in flight
    page = slot // page_size
    off = slot % page_size
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    for h0 in range(0, n_heads, BLOCK_H):
        hh = h0 + heads
        mask = (hh < n_heads)[:, None] & (dims < head_dim)[None, :]
        x = tl.load(src_ptr + tok * stride_st + hh[:, None] * stride_sh + dims[None, :], mask=mask)
        if HAS_SCALE:
            xs = x.to(tl.float32) / tl.load(scale_ptr)
            x = tl.minimum(tl.maximum(xs, -FP8_MAX), FP8_MAX)
        dst = cache_ptr + page * stride_cp + off * stride_co + hh[:, None] * stride_ch + dims[None, :]
        live = (hh[:, None] * 0 + slot) >= 0  # slot broadcast to the tile
        tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask & live)


# The step's token count is not specialised on (==1, %16): new counts would compile variants mid-run.
@triton.jit(do_not_specialize=["n_tokens"])
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    n_tokens,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kcp,
    stride_kco,
    stride_kch,
    stride_vcp,
    stride_vco,
    stride_vch,
    page_size,
    n_heads,
    head_dim,
    HAS_SCALE: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    TOKENS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    # TOKENS tokens per program (unrolled): their independent loads overlap
    for i in tl.static_range(TOKENS):
        tok = tl.program_id(0).to(tl.int64) * TOKENS + i
        if tok < n_tokens:
            slot = tl.load(slot_ptr + tok).to(tl.int64)  # -1: skipped (masked stores)
            _store_one(
                k_ptr,
                kc_ptr,
                tok,
                slot,
                stride_kt,
                stride_kh,
                stride_kcp,
                stride_kco,
                stride_kch,
                page_size,
                n_heads,
                head_dim,
                k_scale_ptr,
                HAS_SCALE,
                FP8_MAX,
                BLOCK_H,
                BLOCK_D,
            )
            _store_one(
                v_ptr,
                vc_ptr,
                tok,
                slot,
                stride_vt,
                stride_vh,
                stride_vcp,
                stride_vco,
                stride_vch,
                page_size,
                n_heads,
                head_dim,
                v_scale_ptr,
                HAS_SCALE,
                FP8_MAX,
                BLOCK_H,
                BLOCK_D,
            )


@register("kv_store", "paged", "triton_store_kv", FLOAT_DTYPES + FP8_DTYPES, features=("fp8_kv",))
def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale=None,
    v_scale=None,
    _tokens_per_program: int = 1,
    _num_warps: int = 2,
) -> None:
    """k, v: [T, Hkv, D] -> k_cache, v_cache: [num_pages, page_size, Hkv, D] at slot_mapping: int64 [T].

    Launch defaults (1 token per program, 2 warps) are the best of a tokens x warps sweep on the H200.
    """
    check(k.dim() == 3 and v.shape == k.shape, "k and v must be [T, Hkv, D] of one shape")
    check(k_cache.dim() == 4 and v_cache.shape == k_cache.shape, "caches must be [pages, page_size, Hkv, D]")
    t, hkv, d = k.shape
    check(tuple(k_cache.shape[2:]) == (hkv, d), "cache heads/dim differ from k")
    check(slot_mapping.shape == (t,), "slot_mapping must be [T]")
    check_dtype("k", k, FLOAT_DTYPES)
    check(
        k.stride(2) == 1 and v.stride(2) == 1 and k_cache.stride(3) == 1 and v_cache.stride(3) == 1,
        "last dims must be contiguous",
    )
    is_fp8 = k_cache.dtype in FP8_DTYPES
    check(is_fp8 or k_cache.dtype == k.dtype, "a non-fp8 cache must have k's dtype")
    check((k_scale is None) == (v_scale is None), "give both k_scale and v_scale or neither")
    if t == 0:
        return
    has_scale = k_scale is not None
    if is_fp8 and not has_scale:
        k_scale = v_scale = 1.0
        has_scale = True
    ks = scale_tensor(k_scale, k.device) if has_scale else slot_mapping
    vs = scale_tensor(v_scale, k.device) if has_scale else slot_mapping
    fp8_max = float(torch.finfo(k_cache.dtype).max) if is_fp8 else 3.0e38
    block_d = triton.next_power_of_2(d)
    block_h = max(1, min(triton.next_power_of_2(hkv), 2048 // block_d))
    tokens = max(1, int(_tokens_per_program))
    _store_kv_kernel[(triton.cdiv(t, tokens),)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        ks,
        vs,
        t,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        k_cache.shape[1],
        hkv,
        d,
        HAS_SCALE=has_scale,
        FP8_MAX=fp8_max,
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        TOKENS=tokens,
        num_warps=_num_warps,
        **pdl_args(k.device),
    )


@triton.jit
def _rope_store_kv_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    cs_ptr,
    kc_ptr,
    vc_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    n_q_heads,
    n_kv_heads,
    head_dim,
    page_size,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_kcp,
    stride_kco,
    stride_kch,
    stride_vcp,
    stride_vco,
    stride_vch,
    IS_NEOX: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    FP8_MAX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok)
    slot = tl.load(slot_ptr + tok).to(tl.int64)  # issued early: the k/v stores wait on it
    cs_row = cs_ptr + pos * stride_cs
    # q: rotated in place, pair by pair, as apply_rope does
    i = tl.arange(0, BLOCK_R)
    cos = tl.load(cs_row + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(cs_row + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr, stride_qt, stride_qh, tok, n_q_heads, cos, sin, IS_NEOX, HALF, BLOCK_HQ, BLOCK_R)
    # k: each feature with its rotation partner, over the full head (features past rot_dim keep
    # cos 1, sin 0), so the whole head goes to the cache in one store
    dims = tl.arange(0, BLOCK_D)
    if IS_NEOX:  # pairs (j, j + rot/2)
        first = dims < HALF
        partner = tl.where(first, dims + HALF, dims - HALF)
        freq = tl.where(first, dims, dims - HALF)
    else:  # pairs (2j, 2j + 1)
        first = (dims % 2) == 0
        partner = tl.where(first, dims + 1, dims - 1)
        freq = dims // 2
    rotated = dims < 2 * HALF
    c = tl.load(cs_row + freq, mask=rotated, other=1.0).to(tl.float32)
    s = tl.load(cs_row + HALF + freq, mask=rotated, other=0.0).to(tl.float32)
    s = tl.where(first, -s, s)
    page = slot // page_size
    off = slot % page_size
    heads = tl.arange(0, BLOCK_H)
    for h0 in range(0, n_kv_heads, BLOCK_H):
        hh = h0 + heads
        mask = (hh < n_kv_heads)[:, None] & (dims < head_dim)[None, :]
        live = mask & ((hh[:, None] * 0 + slot) >= 0)
        k_row = k_ptr + tok * stride_kt + hh[:, None] * stride_kh
        x = tl.load(k_row + dims[None, :], mask=mask, other=0.0).to(tl.float32)
        xp = tl.load(k_row + partner[None, :], mask=mask & rotated[None, :], other=0.0).to(tl.float32)
        # rounded through k's dtype, as apply_rope then store_kv would leave it
        y = (x * c[None, :] + xp * s[None, :]).to(k_ptr.dtype.element_ty)
        xv = tl.load(v_ptr + tok * stride_vt + hh[:, None] * stride_vh + dims[None, :], mask=mask)
        if HAS_SCALE:
            y = tl.minimum(tl.maximum(y.to(tl.float32) / tl.load(k_scale_ptr), -FP8_MAX), FP8_MAX)
            xv = tl.minimum(tl.maximum(xv.to(tl.float32) / tl.load(v_scale_ptr), -FP8_MAX), FP8_MAX)
        kdst = kc_ptr + page * stride_kcp + off * stride_kco + hh[:, None] * stride_kch + dims[None, :]
        vdst = vc_ptr + page * stride_vcp + off * stride_vco + hh[:, None] * stride_vch + dims[None, :]
        tl.store(kdst, y.to(kc_ptr.dtype.element_ty), mask=live)
        tl.store(vdst, xv.to(vc_ptr.dtype.element_ty), mask=live)


@register("kv_store", "rope_paged", "triton_rope_store_kv", FLOAT_DTYPES + FP8_DTYPES, features=("fp8_kv",))
def rope_store_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    is_neox: bool = True,
    k_scale=None,
    v_scale=None,
) -> torch.Tensor:
    """Rotate q [T, Hq, D] in place; write rotated k and v [T, Hkv, D] into k_cache, v_cache
    [num_pages, page_size, Hkv, D] at slot_mapping int64 [T] (-1 skips). Returns q. k is not modified."""
    check(q.dim() == 3 and k.dim() == 3 and v.shape == k.shape, "q must be [T, Hq, D]; k and v [T, Hkv, D]")
    check(k_cache.dim() == 4 and v_cache.shape == k_cache.shape, "caches must be [pages, page_size, Hkv, D]")
    t, hq, d = q.shape
    hkv = k.shape[1]
    check(k.shape[0] == t and k.shape[2] == d, "k must be [T, Hkv, D] with q's T and D")
    check(tuple(k_cache.shape[2:]) == (hkv, d), "cache heads/dim differ from k")
    check(positions.shape == (t,) and slot_mapping.shape == (t,), f"positions and slot_mapping must be [{t}]")
    check_dtype("q", q, FLOAT_DTYPES)
    check(k.dtype == q.dtype and v.dtype == q.dtype, "q, k and v dtypes differ")
    check(cos_sin_cache.dim() == 2 and cos_sin_cache.stride(1) == 1, "cos_sin_cache must be [max_pos, rot_dim]")
    rot = cos_sin_cache.shape[1]
    check(rot % 2 == 0 and rot <= d, f"rot_dim {rot} must be even and <= head dim {d}")
    check(q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1, "q, k, v: last dim must be contiguous")
    check(k_cache.stride(3) == 1 and v_cache.stride(3) == 1, "caches: last dim must be contiguous")
    is_fp8 = k_cache.dtype in FP8_DTYPES
    check(is_fp8 or k_cache.dtype == k.dtype, "a non-fp8 cache must have k's dtype")
    check((k_scale is None) == (v_scale is None), "give both k_scale and v_scale or neither")
    if t == 0:
        return q
    has_scale = k_scale is not None or is_fp8
    if is_fp8 and k_scale is None:
        k_scale = v_scale = 1.0
    ks = scale_tensor(k_scale, k.device) if has_scale else slot_mapping
    vs = scale_tensor(v_scale, k.device) if has_scale else slot_mapping
    half = rot // 2
    block_r = triton.next_power_of_2(max(half, 1))
    block_d = triton.next_power_of_2(d)
    _rope_store_kv_kernel[(t,)](
        positions,
        q,
        k,
        v,
        cos_sin_cache,
        k_cache,
        v_cache,
        slot_mapping,
        ks,
        vs,
        hq,
        hkv,
        d,
        k_cache.shape[1],
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos_sin_cache.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        IS_NEOX=bool(is_neox),
        HALF=half,
        BLOCK_HQ=max(1, min(triton.next_power_of_2(hq), 4096 // block_r)),
        BLOCK_R=block_r,
        HAS_SCALE=has_scale,
        FP8_MAX=float(torch.finfo(k_cache.dtype).max) if is_fp8 else 3.0e38,
        BLOCK_H=max(1, min(triton.next_power_of_2(hkv), 2048 // block_d)),
        BLOCK_D=block_d,
        num_warps=4,
        **pdl_args(q.device),
    )
    return q
