"""Write the K/V of new tokens into the paged cache by slot_mapping (slot = page * page_size + offset).

One program per token copies all of its heads for K and V; slot -1 skips the token. An fp8 cache
stores k / k_scale, saturated to the format's finite range.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, FP8_DTYPES, check, check_dtype, register, scale_tensor


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
):
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
    )
