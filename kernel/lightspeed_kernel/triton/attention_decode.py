"""Paged decode attention: 1..16 query tokens per request, GQA folded, split-KV with a combine step.

Design note. Decode is bound by reading the KV cache, so the kernel is organised to read each KV
element exactly once and to keep enough independent tiles in flight to saturate HBM:
- GQA fold: one program owns one (request, kv head) and all Hq/Hkv query heads × q_len query tokens
  of it (rows m = qi * GROUP + g), so K/V tiles are loaded once per kv head, not once per q head.
- Split-KV: with few requests (B * Hkv programs well below the SM count) the context is cut into
  fixed token ranges, one program each, writing a normalised partial output and its log-sum-exp;
  a second kernel combines the splits. The split count is chosen by `plan_decode` from shapes only
  (batch, heads, page-table width), so one plan serves every layer of a step and CUDA-graph replays.
- plan/run: `plan_decode` picks the split count and tiles; `run_decode` takes a caller-owned fp32
  workspace (`decode_workspace_numel`) and allocates nothing when it is given.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ..env import kernel_env
from ._attention import attend_tile
from ._common import (
    FLOAT_DTYPES,
    FP8_DTYPES,
    check,
    dot_upcast,
    next_pow2,
    pdl_args,
    pdl_enter,
    register,
    scale_tensor,
)

MAX_QUERY_LEN = 16
# At most this many (request, kv head) programs is a small grid (batch 1-2 of an 8-kv-head model):
# the H200 sweep's winners there (bench/results/h200_profile_2026-12-03_1156/, kernels_*) are block_n
# 32 and six waves of splits, down to 64 keys a split: 22.3 vs 24.2 us at batch 1 x 8K, 50.9 vs 52.9
# at 1 x 32K, 81.2 vs 85.6 at 2 x 32K, exactly the split counts this plan gives (86, 94, 49).
SMALL_GRID_PROGRAMS = 16


# The page-table width changes from step to step, and outside CUDA graphs so does the split plan
# (from the host's lengths): specialising on them (==1, %16) would compile new variants in the
# middle of serving.
@triton.jit(do_not_specialize=["stride_pt", "split_tokens", "num_splits"])
def _decode_kernel(
    q_ptr,
    k_cache,
    v_cache,
    page_table,
    qsl_ptr,
    seq_lens_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sm_scale,
    soft_cap,
    split_tokens,
    num_splits,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_pt,
    stride_cp,
    stride_co,
    stride_ch,
    GROUP: tl.constexpr,
    SPLIT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    # split_tokens is sized for the page table's width (a CUDA graph's is max_model_len): a shorter
    # request spreads its own keys over all num_splits programs instead of leaving most of them idle
    # (a 1K-token request under a 64K-wide graph ran in one split: 8 programs for the whole GPU).
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    split_len = tl.minimum(split_tokens, per_split)
    kv_start = split * split_len
    kv_end = tl.minimum(seq_len, kv_start + split_len)

    rows = tl.arange(0, BLOCK_M)
    qi = rows // GROUP
    head = kvh * GROUP + rows % GROUP
    row_valid = qi < q_len
    tokens = (q_start + qi).to(tl.int64)
    # bottom-right causal: query qi is at position seq_len - q_len + qi
    row_limit = tl.where(row_valid, seq_len - q_len + qi, -1)
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < HEAD_DIM
    qmask = row_valid[:, None] & dmask[None, :]
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :], mask=qmask, other=0.0
    )

    qk_scale = sm_scale * 1.4426950408889634
    if HAS_SCALE:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pt_row = page_table + b.to(tl.int64) * stride_pt
    head_off = kvh.to(tl.int64) * stride_ch
    for n0 in range(kv_start, kv_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            acc,
            m_i,
            l_i,
            q,
            k_cache,
            v_cache,
            pt_row,
            n0,
            kv_end,
            row_limit,
            head_off,
            stride_cp,
            stride_co,
            qk_scale,
            soft_cap,
            PAGE_SIZE,
            BLOCK_N,
            BLOCK_D,
            HEAD_DIM,
            HAS_SOFT_CAP,
            DOT_UPCAST,
        )
    if HAS_SCALE:
        acc = acc * tl.load(v_scale_ptr)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    if not SPLIT:
        optr = out_ptr + tokens[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=qmask)
    else:
        # partials: o [T, Hq, num_splits, BLOCK_D], lse (base 2) [T, Hq, num_splits]
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        th = tokens * (GROUP * tl.num_programs(1)) + head
        tl.store(part_lse_ptr + th * num_splits + split, lse, mask=row_valid)
        pptr = part_o_ptr + (th[:, None] * num_splits + split) * BLOCK_D + dims[None, :]
        tl.store(pptr, o, mask=row_valid[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _combine_kernel(
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    n_heads,
    stride_ot,
    stride_oh,
    num_splits,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    th = tok * n_heads + head
    splits = tl.arange(0, BLOCK_S)
    smask = splits < num_splits
    lse = tl.load(part_lse_ptr + th * num_splits + splits, mask=smask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.exp2(lse - m)
    w = w / tl.sum(w, axis=0)
    dims = tl.arange(0, BLOCK_D)
    o = tl.load(
        part_o_ptr + (th * num_splits + splits[:, None]) * BLOCK_D + dims[None, :],
        mask=smask[:, None],
        other=0.0,
    )
    res = tl.sum(o * w[:, None], axis=0)
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + dims,
        res.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


@functools.cache
def _num_sms() -> int:
    if not torch.cuda.is_available():
        return 8
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Launch decisions for one decode batch shape; valid for every layer with these shapes."""

    num_splits: int  # programs per (request, kv head) along the context
    split_tokens: int  # keys per split at the page table's full width, a multiple of block_n (the
    # kernel splits a shorter request's keys evenly over num_splits, never more than this per split)
    block_m: int  # rows per program: next_pow2(GROUP * max_query_len), at least 16
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int


# A pure function of shapes, asked by every layer of every eager step: planned once per shape
# (about 40 us of Python each on a slow host, x layers, per step).
@functools.lru_cache(maxsize=4096)
def plan_decode(
    batch_size: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    max_pages: int,
    max_query_len: int = 1,
    *,
    num_sms: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    num_splits: int | None = None,
) -> DecodePlan:
    """Choose the split count and tiles from shapes only (no device reads: graph-capture safe).

    Tiles (block_n 64, 4 warps, 2 stages) are the best of a block_n x warps x stages x splits sweep
    on the H200 (bench/results/kernels_*_h200.md): 88-104% of 4.27 TB/s at batch 16-256.

    Splits are added until B * Hkv * splits fills about three waves of programs, never cutting the
    context below 256 keys per split (the combine pass would cost more than it saves). A small grid
    (B * Hkv <= SMALL_GRID_PROGRAMS, head_dim <= 128) takes block_n 32 and six waves, down to 64 keys
    a split, at most 128 splits (the sweep's winners; LIGHTSPEED_KERNEL_DECODE_SMALL_GRID=0: off)."""
    check(num_q_heads % num_kv_heads == 0, "Hq must be a multiple of Hkv")
    check(1 <= max_query_len <= MAX_QUERY_LEN, f"decode takes 1..{MAX_QUERY_LEN} query tokens per request")
    group = num_q_heads // num_kv_heads
    if num_sms is None:
        num_sms = _num_sms()
    block_m = max(16, next_pow2(group * max_query_len))
    max_ctx = max(1, max_pages * page_size)
    programs = max(1, batch_size * num_kv_heads)
    small = programs <= SMALL_GRID_PROGRAMS and head_dim <= 128 and kernel_env().decode_small_grid
    if block_n is None:
        block_n = 32 if small or head_dim > 128 else 64
    if num_splits is None:
        waves, min_keys, most = (6, 64, 128) if small else (3, 256, 64)
        want = triton.cdiv(waves * num_sms, programs)
        num_splits = max(1, min(want, triton.cdiv(max_ctx, min_keys), most))
    split_tokens = triton.cdiv(triton.cdiv(max_ctx, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_ctx, split_tokens)
    return DecodePlan(
        num_splits=num_splits,
        split_tokens=split_tokens,
        block_m=block_m,
        block_n=block_n,
        num_warps=num_warps or 4,
        num_stages=num_stages or 2,
    )


def decode_workspace_numel(plan: DecodePlan, num_tokens: int, num_q_heads: int, head_dim: int) -> int:
    """fp32 elements of workspace `run_decode` needs (0 when there is one split)."""
    if plan.num_splits == 1:
        return 0
    return num_tokens * num_q_heads * plan.num_splits * (next_pow2(head_dim) + 1)


def check_paged_args(q, k_cache, v_cache, page_table, query_start_loc, seq_lens):
    check(q.dim() == 3, "q must be [T, Hq, D]")
    check(k_cache.dim() == 4 and v_cache.shape == k_cache.shape, "caches must be [pages, page_size, Hkv, D]")
    t, hq, d = q.shape
    hkv = k_cache.shape[2]
    check(k_cache.shape[3] == d, "cache head dim differs from q")
    check(hq % hkv == 0, f"Hq={hq} must be a multiple of Hkv={hkv}")
    check(q.dtype in FLOAT_DTYPES, f"q dtype {q.dtype} unsupported")
    check(k_cache.dtype == q.dtype or k_cache.dtype in FP8_DTYPES, "cache dtype must be q's or fp8")
    check(
        k_cache.stride(1) == v_cache.stride(1)
        and k_cache.stride(0) == v_cache.stride(0)
        and k_cache.stride(2) == v_cache.stride(2),
        "k and v caches must share strides",
    )
    check(q.stride(2) == 1 and k_cache.stride(3) == 1, "last dims must be contiguous")
    check(page_table.dim() == 2 and page_table.dtype == torch.int32, "page_table must be int32 [B, P]")
    check(page_table.stride(1) == 1, "page_table rows must be contiguous")
    b = page_table.shape[0]
    check(
        query_start_loc.shape == (b + 1,) and query_start_loc.dtype == torch.int32,
        "query_start_loc must be int32 [B+1]",
    )
    check(seq_lens.shape == (b,) and seq_lens.dtype == torch.int32, "seq_lens must be int32 [B]")
    return t, hq, d, hkv, b


def run_decode(
    plan: DecodePlan,
    q,
    k_cache,
    v_cache,
    page_table,
    query_start_loc,
    seq_lens,
    *,
    scale: float,
    soft_cap: float | None = None,
    k_scale=None,
    v_scale=None,
    out=None,
    workspace=None,
):
    """Decode attention with a fixed plan; no allocation when `out` and `workspace` are given."""
    t, hq, d, hkv, b = check_paged_args(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(2) == 1, "out must be [T, Hq, D]")
    if t == 0 or b == 0:
        return out
    group = hq // hkv
    check(plan.block_m >= group, "plan was made for other head counts")
    block_d = next_pow2(d)
    is_fp8 = k_cache.dtype in FP8_DTYPES
    has_scale = is_fp8 or k_scale is not None
    ks = scale_tensor(1.0 if k_scale is None else k_scale, q.device) if has_scale else seq_lens
    vs = scale_tensor(1.0 if v_scale is None else v_scale, q.device) if has_scale else seq_lens
    splits = plan.num_splits
    if splits > 1:
        need = t * hq * splits * (block_d + 1)
        if workspace is None:
            workspace = torch.empty(need, dtype=torch.float32, device=q.device)
        check(workspace.dtype == torch.float32 and workspace.numel() >= need, f"workspace needs {need} fp32")
        part_o = workspace[: t * hq * splits * block_d]
        part_lse = workspace[t * hq * splits * block_d : need]
    else:
        part_o = part_lse = out
    _decode_kernel[(b, hkv, splits)](
        q,
        k_cache,
        v_cache,
        page_table,
        query_start_loc,
        seq_lens,
        out,
        part_o,
        part_lse,
        ks,
        vs,
        float(scale),
        float(soft_cap or 0.0),
        plan.split_tokens,
        splits,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        page_table.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        GROUP=group,
        SPLIT=splits > 1,
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        BLOCK_D=block_d,
        HEAD_DIM=d,
        HAS_SOFT_CAP=soft_cap is not None and soft_cap > 0,
        HAS_SCALE=has_scale,
        DOT_UPCAST=dot_upcast(),
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
        **pdl_args(q.device),
    )
    if splits > 1:
        _combine_kernel[(t, hq)](
            part_o,
            part_lse,
            out,
            hq,
            out.stride(0),
            out.stride(1),
            splits,
            BLOCK_S=next_pow2(splits),
            BLOCK_D=block_d,
            HEAD_DIM=d,
            num_warps=4,
            **pdl_args(q.device),
        )
    return out


@register("attention", "decode", "triton_paged_decode", FLOAT_DTYPES, features=("fp8_kv", "soft_cap", "gqa"))
def attention_decode(
    q,
    k_cache,
    v_cache,
    page_table,
    query_start_loc,
    seq_lens,
    *,
    max_query_len: int,
    scale: float,
    soft_cap=None,
    k_scale=None,
    v_scale=None,
    out=None,
    host_lengths=None,  # not read: the kernel takes the lengths on the device
):
    """Paged decode attention. q: [T, Hq, D] (1..16 new tokens per request, causal among them and
    bottom-right aligned after the cached context); k/v_cache: [pages, page_size, Hkv, D];
    page_table int32 [B, P]; query_start_loc int32 [B+1]; seq_lens int32 [B] -> [T, Hq, D]."""
    t, hq, d, hkv, b = check_paged_args(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    plan = plan_decode(b, hq, hkv, d, k_cache.shape[1], page_table.shape[1], max(1, int(max_query_len)))
    return run_decode(
        plan,
        q,
        k_cache,
        v_cache,
        page_table,
        query_start_loc,
        seq_lens,
        scale=scale,
        soft_cap=soft_cap,
        k_scale=k_scale,
        v_scale=v_scale,
        out=out,
    )
