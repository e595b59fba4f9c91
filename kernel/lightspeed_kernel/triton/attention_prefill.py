"""Paged prefill attention over a cached prefix (FlashAttention-2 style, one q head per program).

Each request's new tokens are its last q_len tokens: query i sits at position
seq_len - q_len + i and sees keys 0 .. that position (bottom-right aligned causal mask), so the
cached prefix is read through the page table exactly like the new tokens' K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._attention import attend_tile
from ._common import FLOAT_DTYPES, FP8_DTYPES, check, dot_upcast, next_pow2, register, scale_tensor
from .attention_decode import check_paged_args


# The page-table width changes from step to step: specialising on it (==1, %16) would compile
# new variants in the middle of serving. So would the alignment of the per-row arrays: a mixed step
# passes the prefill rows' slices (`seq_lens[num_decodes:]`, `page_table[num_decodes:]`), whose
# 16-byte alignment follows the number of decode rows (the kernel reads them one scalar at a time).
@triton.jit(do_not_specialize=["stride_pt"],
            do_not_specialize_on_alignment=["page_table", "qsl_ptr", "seq_lens_ptr", "k_scale_ptr", "v_scale_ptr"])
def _prefill_kernel(
    q_ptr,
    k_cache,
    v_cache,
    page_table,
    qsl_ptr,
    seq_lens_ptr,
    out_ptr,
    k_scale_ptr,
    v_scale_ptr,
    sm_scale,
    soft_cap,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_pt,
    stride_cp,
    stride_co,
    stride_ch,
    GROUP: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HAS_SOFT_CAP: tl.constexpr,
    HAS_SCALE: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PACK_GQA: tl.constexpr = False,
    WARP_SPECIALIZE: tl.constexpr = False,
):
    # Heads vary fastest in launch order, so the GROUP query heads sharing a KV head run side by side
    # and read its pages once from HBM (then from L2); within a request, the longest query blocks
    # (last, most keys) start first, so the short ones fill the tail of the grid.
    # PACK_GQA: one program per KV head instead, its BLOCK_M rows being BLOCK_M / GROUP tokens x the
    # GROUP query heads (row r: token r // GROUP, head r % GROUP), so each K/V tile loaded serves
    # every head that reads it and the causal diagonal spans fewer tiles.
    TOKENS: tl.constexpr = BLOCK_M // GROUP if PACK_GQA else BLOCK_M
    mblock = tl.num_programs(1) - 1 - tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if mblock * TOKENS < q_len:
        seq_len = tl.load(seq_lens_ptr + b)
        prefix = seq_len - q_len
        rows = tl.arange(0, BLOCK_M)
        if PACK_GQA:
            kvh = tl.program_id(0)
            head = kvh * GROUP + rows % GROUP
            qi = mblock * TOKENS + rows // GROUP
            row_valid = (qi < q_len) & (rows < TOKENS * GROUP)
        else:
            head = tl.program_id(0)
            kvh = head // GROUP
            qi = mblock * TOKENS + rows
            row_valid = qi < q_len
        row_limit = tl.where(row_valid, prefix + qi, -1)
        kv_end = tl.minimum(seq_len, prefix + (mblock + 1) * TOKENS)
        # Keys before this block's first query row are visible to all of its rows: those whole tiles
        # skip the causal mask; only the tiles on the diagonal build it.
        full_end = ((prefix + mblock * TOKENS) // BLOCK_N) * BLOCK_N
        tokens = (q_start + qi).to(tl.int64)
        dims = tl.arange(0, BLOCK_D)
        qmask = row_valid[:, None] & (dims < HEAD_DIM)[None, :]
        if PACK_GQA:
            head_rows = (head * stride_qh)[:, None]
            out_head_rows = (head * stride_oh)[:, None]
        else:
            head_rows = head * stride_qh
            out_head_rows = head * stride_oh
        q = tl.load(q_ptr + tokens[:, None] * stride_qt + head_rows + dims[None, :], mask=qmask, other=0.0)
        qk_scale = sm_scale * 1.4426950408889634
        if HAS_SCALE:
            qk_scale = qk_scale * tl.load(k_scale_ptr)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        pt_row = page_table + b.to(tl.int64) * stride_pt
        head_off = kvh.to(tl.int64) * stride_ch
        # WARP_SPECIALIZE: Triton's automatic warp specialisation of the mask-free loop (sm_90 since
        # Triton 3.5): producer warps issue the K/V loads, consumer warp groups the wgmma and softmax,
        # so loads, MMAs and exp2 overlap as in FlashAttention-3. Measured per shape before it is chosen.
        for n0 in tl.range(0, full_end, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            acc, m_i, l_i = attend_tile(
                acc, m_i, l_i, q, k_cache, v_cache, pt_row, n0, kv_end, row_limit, head_off, stride_cp,
                stride_co, qk_scale, soft_cap, PAGE_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, HAS_SOFT_CAP,
                DOT_UPCAST, MASKED=False,
            )
        for n0 in range(full_end, kv_end, BLOCK_N):
            acc, m_i, l_i = attend_tile(
                acc, m_i, l_i, q, k_cache, v_cache, pt_row, n0, kv_end, row_limit, head_off, stride_cp,
                stride_co, qk_scale, soft_cap, PAGE_SIZE, BLOCK_N, BLOCK_D, HEAD_DIM, HAS_SOFT_CAP,
                DOT_UPCAST, MASKED=True,
            )
        if HAS_SCALE:
            acc = acc * tl.load(v_scale_ptr)
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + tokens[:, None] * stride_ot + out_head_rows + dims[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=qmask,
        )


@register(
    "attention", "prefill", "triton_paged_prefill", FLOAT_DTYPES, features=("fp8_kv", "soft_cap", "gqa")
)
def attention_prefill(
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
    """Paged prefill attention. q: [T, Hq, D], the last q_len tokens of each request;
    k/v_cache: [pages, page_size, Hkv, D] already holding the new tokens' K/V; page_table int32 [B, P];
    query_start_loc int32 [B+1]; seq_lens int32 [B]; max_query_len >= every q_len -> [T, Hq, D]."""
    t, hq, d, hkv, b = check_paged_args(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(2) == 1, "out must be [T, Hq, D]")
    if t == 0 or b == 0 or max_query_len <= 0:
        return out
    tiles = prefill_tiles(d, int(max_query_len), q.dtype)
    return launch_prefill(
        q, k_cache, v_cache, page_table, query_start_loc, seq_lens, out, b, hq, hkv, d,
        max_query_len=int(max_query_len), scale=scale, soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale,
        tiles=tiles,
    )


@dataclass(frozen=True)
class PrefillTiles:
    block_m: int    # query rows per program
    block_n: int    # keys per inner step
    num_warps: int
    num_stages: int
    pack_gqa: bool = False  # rows = tokens x the query heads of one KV head (block_m >= group; spare rows idle)
    warp_specialize: bool = False  # the mask-free loop warp-specialised (sm_90 + Triton >= 3.5 only)


def prefill_tiles(head_dim: int, max_query_len: int, dtype: torch.dtype) -> PrefillTiles:
    """Launch shape for one prefill call. Long query blocks (128 rows, 8 warps: two warp groups of
    wgmma on sm_90) amortise each K/V tile over more rows; shorter chunks keep 64 rows so the grid
    still fills the GPU. Two stages measured as good as three or better (LONG_QUERY_ROWS)."""
    if dot_upcast():  # interpreter: small tiles run faster on numpy
        return PrefillTiles(16, 16, 4, 1)
    block_d = next_pow2(head_dim)
    if block_d > 128:
        return PrefillTiles(32, 32, 4, 2)
    if dtype == torch.float32:  # fp32 tiles take twice the shared memory
        return PrefillTiles(64, 64, 4, 2)
    if max_query_len >= LONG_QUERY_ROWS:
        return PrefillTiles(128, 128, 8, 2)
    return PrefillTiles(64, 64, 4, 2)


# Query length from which 128 x 128 tiles are used. The H200 sweep of this kernel
# (bench/results/prefill_attention_2026-12-01_181726_nvidia-h200.md): below 8K new tokens 64 x 64 /
# 4 warps / 2 stages is best (800 over 22K cached: 292 TFLOP/s vs 277 with 3 stages; 3.6K over 16K: 371
# vs 354; 4K fresh: 362 vs 345 for 128 x 128); from 16K up 128 x 128 / 8 warps / 2 stages (378-390, 1-2%
# over 3 stages and over 64 x 64); at 8K the two are within 2%.
LONG_QUERY_ROWS = 8192


def launch_prefill(
    q, k_cache, v_cache, page_table, query_start_loc, seq_lens, out, b, hq, hkv, d, *, max_query_len, scale,
    soft_cap, k_scale, v_scale, tiles: PrefillTiles,
):
    """The kernel launch with explicit tiles (the benchmark sweeps them; attention_prefill chooses)."""
    block_d = next_pow2(d)
    is_fp8 = k_cache.dtype in FP8_DTYPES
    has_scale = is_fp8 or k_scale is not None
    ks = scale_tensor(1.0 if k_scale is None else k_scale, q.device) if has_scale else seq_lens
    vs = scale_tensor(1.0 if v_scale is None else v_scale, q.device) if has_scale else seq_lens
    group = hq // hkv
    pack = tiles.pack_gqa and group > 1
    if pack:
        check(tiles.block_m >= group, "packed tiles: block_m must hold a whole group of query heads")
    rows_per_block = tiles.block_m // group if pack else tiles.block_m
    grid = (hkv if pack else hq, triton.cdiv(max_query_len, rows_per_block), b)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        page_table,
        query_start_loc,
        seq_lens,
        out,
        ks,
        vs,
        float(scale),
        float(soft_cap or 0.0),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        page_table.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        GROUP=group,
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n,
        BLOCK_D=block_d,
        HEAD_DIM=d,
        HAS_SOFT_CAP=soft_cap is not None and soft_cap > 0,
        HAS_SCALE=has_scale,
        DOT_UPCAST=dot_upcast(),
        PACK_GQA=pack,
        WARP_SPECIALIZE=tiles.warp_specialize and not dot_upcast(),
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )
    return out
