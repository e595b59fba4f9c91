"""Absorbed MLA attention (decode, and short ragged prefill) with a plan/run API.

``plan_decode`` runs once per batch: it picks the fold layout, the tile and the split count from
the host-side lengths, copies the lengths into the caller-owned workspace and carves the split
buffers out of it. ``run_decode`` runs per layer: two launches at most, no allocation, no host
sync, so a CUDA graph can capture it. Re-planning a captured workspace with the same batch shape
and the same ``num_splits`` (pass it explicitly) rewrites only the lengths: the graph stays valid.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ._triton import interpreting, require_triton, tl
from .cache import D_LATENT, D_PACKED, MLACache
from .device import device_info
from .kernels import decode_triton as _k
from .tuning import MMA_M, DecodeTile, decode_tile

LOG2E = 1.4426950408889634
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (Q load, partial write) dominates
MAX_SPLITS = 128
_ALIGN = 256


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(n: int) -> int:
    return _cdiv(n, _ALIGN) * _ALIGN


def decode_workspace_bytes(max_batch: int, max_tokens: int, num_heads: int, max_splits: int = MAX_SPLITS) -> int:
    """Bytes of workspace that ``plan_decode`` needs for up to these sizes."""
    rows = max_tokens * num_heads * max_splits
    return _align(4 * (max_batch + 1)) + _align(4 * max_batch) + _align(4 * rows) + _align(4 * D_LATENT * rows)


@dataclass(frozen=True)
class MLADecodePlan:
    """A planned absorbed-attention batch. Tensors are views into the caller's workspace."""

    batch_size: int
    num_tokens: int  # T: total query tokens (rows of q / out)
    num_heads: int
    max_q_len: int
    fold: bool  # query tokens share M tiles (see kernels/decode_triton.py)
    heads_padded: int  # H (folded) or H rounded up to block_m (one token per tile)
    row_tiles: int  # M tiles per request
    num_splits: int
    tile: DecodeTile
    cache_kind: str
    page_size: int
    softmax_scale: float
    query_start_loc: torch.Tensor  # [B+1] int32, device
    seq_lens: torch.Tensor  # [B] int32, device
    partial_out: torch.Tensor | None  # [T, H, S, 512] fp32
    partial_lse: torch.Tensor | None  # [T, H, S] fp32 (log2 domain)


def should_fold(num_heads: int, max_q_len: int, mma_m: int) -> bool:
    """Fold query tokens into the M tile when one token's heads leave it part-empty."""
    return max_q_len > 1 and num_heads < mma_m


def choose_num_splits(ctas: int, max_kv_len: int, num_sms: int, max_splits: int, ctas_per_sm: int = 1) -> int:
    """Split the keys so the grid fills one wave of resident CTAs, and never more than one.

    Rounding down matters: 17 splits of 16 requests at two CTAs per SM on 132 SMs make 272 CTAs,
    264 run and 8 wait for them, nearly doubling the time (seen on the H200: 59% of HBM
    bandwidth at 17 splits). Splits stay >= MIN_TOKENS_PER_SPLIT long.
    """
    slots = num_sms * ctas_per_sm
    if ctas == 0 or ctas >= slots:
        return 1
    return max(1, min(slots // ctas, max_kv_len // MIN_TOKENS_PER_SPLIT, max_splits))


def _layout(B, max_q, max_kv, num_heads, info, cache_kind, fold, tile):
    """(fold, tile, heads_padded, row_tiles, num_splits) for a batch: the planning heuristics."""
    mma_m = MMA_M.get(info.arch_major, 64) if info.arch_major is not None else 16
    do_fold = should_fold(num_heads, max_q, mma_m) if fold is None else fold
    rows_wanted = max_q * num_heads if do_fold else num_heads
    tile = tile or decode_tile(info.arch_major, cache_kind, rows_wanted)
    heads_padded = num_heads if do_fold else _cdiv(num_heads, tile.block_m) * tile.block_m
    row_tiles = max(1, _cdiv(max_q * heads_padded, tile.block_m))
    splits = choose_num_splits(B * row_tiles, max_kv, info.num_sms, MAX_SPLITS, tile.ctas_per_sm)
    return do_fold, tile, heads_padded, row_tiles, splits


def _host_i32(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.int32)


def plan_decode(
    workspace: torch.Tensor,
    query_start_loc,
    seq_lens,
    num_heads: int,
    *,
    page_size: int,
    softmax_scale: float,
    cache_kind: str = "bf16",
    fold: bool | None = None,
    num_splits: int | None = None,
    tile: DecodeTile | None = None,
) -> MLADecodePlan:
    """Plan one batch of absorbed MLA attention.

    workspace: uint8 device tensor of at least ``decode_workspace_bytes(...)`` bytes (caller-owned).
    query_start_loc: host [B+1] (numpy / CPU tensor / list): request b's query tokens are rows
    query_start_loc[b] .. query_start_loc[b+1] of q. seq_lens: host [B], keys per request, its
    new tokens included. fold / num_splits / tile override the heuristics (benchmarks, graphs).
    """
    qsl, lens = _host_i32(query_start_loc), _host_i32(seq_lens)
    B = lens.shape[0]
    if qsl.shape != (B + 1,) or qsl[0] != 0 or np.any(np.diff(qsl) < 0):
        raise ValueError("plan_decode: query_start_loc must be [B+1], start at 0 and not decrease")
    q_lens = np.diff(qsl)
    if np.any(q_lens > lens):
        raise ValueError("plan_decode: a request has more query tokens than keys")
    if page_size <= 0 or page_size & (page_size - 1):
        raise ValueError(f"plan_decode: page_size must be a power of two, got {page_size}")
    T = int(qsl[-1])
    max_q = int(q_lens.max()) if B else 0
    max_kv = int(lens.max()) if B else 0
    info = device_info(workspace.device)
    do_fold, tile, heads_padded, row_tiles, want_splits = _layout(
        B, max_q, max_kv, num_heads, info, cache_kind, fold, tile)

    # Carve the workspace: lengths first, then the split buffers sized to what is left.
    off_qsl, off_lens = 0, _align(4 * (B + 1))
    off_parts = off_lens + _align(4 * B)
    room = workspace.numel() - off_parts
    fit = room // ((4 + 4 * D_LATENT) * T * num_heads) if T else MAX_SPLITS
    while fit > 1 and _align(4 * T * num_heads * fit) + _align(4 * D_LATENT * T * num_heads * fit) > room:
        fit -= 1
    if num_splits is None:
        num_splits = max(1, min(want_splits, fit))
    if room < 0 or (num_splits > 1 and num_splits > fit):
        raise ValueError(f"plan_decode: workspace of {workspace.numel()} bytes too small; need "
                         f"{decode_workspace_bytes(B, T, num_heads, num_splits)}")

    ws = workspace
    qsl_dev = ws[off_qsl:off_qsl + 4 * (B + 1)].view(torch.int32)
    lens_dev = ws[off_lens:off_lens + 4 * B].view(torch.int32)
    qsl_dev.copy_(torch.from_numpy(qsl), non_blocking=True)
    lens_dev.copy_(torch.from_numpy(lens), non_blocking=True)
    part_o = part_lse = None
    if num_splits > 1:
        n_lse = 4 * T * num_heads * num_splits
        part_lse = ws[off_parts:off_parts + n_lse].view(torch.float32).view(T, num_heads, num_splits)
        off_o = off_parts + _align(n_lse)
        part_o = ws[off_o:off_o + n_lse * D_LATENT].view(torch.float32).view(T, num_heads, num_splits, D_LATENT)
    return MLADecodePlan(B, T, num_heads, max_q, do_fold, heads_padded, row_tiles, num_splits, tile,
                         cache_kind, page_size, float(softmax_scale), qsl_dev, lens_dev, part_o, part_lse)


def run_decode(
    plan: MLADecodePlan,
    q: torch.Tensor,
    cache: MLACache,
    page_table: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run one layer of a planned batch. No allocation, no host sync.

    q: [T, H, 576] bf16 ([q_latent | q_rope], already absorbed); cache: this layer's MLACache;
    page_table: [B, max_pages] int32 device; out: [T, H, 512] bf16 (written);
    lse: optional [T, H] fp32, natural-log LSE of the scaled scores. Returns out.
    """
    require_triton()
    T, H = plan.num_tokens, plan.num_heads
    if q.shape != (T, H, D_PACKED) or q.stride(-1) != 1:
        raise ValueError(f"run_decode: q must be [{T}, {H}, {D_PACKED}] with unit last stride, got {tuple(q.shape)}")
    if out.shape != (T, H, D_LATENT) or out.stride(-1) != 1:
        raise ValueError(f"run_decode: out must be [{T}, {H}, {D_LATENT}], got {tuple(out.shape)}")
    if lse is not None and (lse.shape != (T, H) or not lse.is_contiguous() or lse.dtype != torch.float32):
        raise ValueError(f"run_decode: lse must be contiguous fp32 [{T}, {H}]")
    if cache.kind != plan.cache_kind or cache.page_size != plan.page_size:
        raise ValueError("run_decode: cache kind / page size differ from the plan's")
    if page_table.dim() != 2 or page_table.shape[0] < plan.batch_size or page_table.stride(-1) != 1:
        raise ValueError("run_decode: page_table must be [B, max_pages] with unit last stride")
    if T == 0:
        return out
    tile, S = plan.tile, plan.num_splits
    is_fp8 = cache.kind == "fp8"
    lse_arg = lse if lse is not None else out
    po = plan.partial_out if S > 1 else out
    pl = plan.partial_lse if S > 1 else out
    po_strides = plan.partial_out.stride()[:3] if S > 1 else (0, 0, 0)
    _k._mla_attn_split_kernel[(plan.batch_size, plan.row_tiles, S)](
        q, cache.latent, cache.rope, cache.scale if is_fp8 else cache.rope,
        page_table, plan.seq_lens, plan.query_start_loc,
        out, lse_arg, po, pl,
        q.stride(0), q.stride(1),
        cache.latent.stride(1), cache.rope.stride(1),
        page_table.stride(0),
        out.stride(0), out.stride(1),
        *po_strides,
        H, plan.heads_padded, plan.softmax_scale * LOG2E, S,
        PAGE_SIZE=plan.page_size, DIRECT_OUT=S == 1, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, SWAP_AB=tile.swap_ab,
        IS_FP8=is_fp8, WRITE_LSE=lse is not None,
        DOT_DTYPE=tl.float32 if interpreting() else tl.bfloat16,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    if S > 1:
        combine_splits(plan, out, lse)
    return out


# Which combine merges split partials: "serial" (one program per (token, head), one split a load),
# "blocked" (BLOCK_S splits a load, 512 / BLOCK_D programs per row) or "auto": blocked from
# BLOCKED_COMBINE_MIN_SPLITS splits. On the H200 (bench/results/mla_splits_2026-12-04_1818_h200/) blocked was
# 4-10% faster a decode at 96-128 splits (batch 1, where the serial loop's chain of one load a split is
# the combine's whole time) and 1-4% slower at 8-33 splits (many rows, few splits: the serial grid is
# wide enough already). LIGHTSPEED_MLA_COMBINE, read once; tools/bench/mla_splits.py sets the attribute.
COMBINE_VARIANT = os.environ.get("LIGHTSPEED_MLA_COMBINE", "auto")
COMBINE_VARIANTS = ("serial", "blocked")
BLOCKED_COMBINE_MIN_SPLITS = 64


def combine_splits(plan: MLADecodePlan, out: torch.Tensor, lse: torch.Tensor | None) -> None:
    """Merge the plan's split partials (plan.partial_out / partial_lse) into out (and lse): the step after
    a split decode kernel, Triton's or sm90's."""
    T, H, S = plan.num_tokens, plan.num_heads, plan.num_splits
    lse_arg = lse if lse is not None else out
    strides = (*plan.partial_out.stride()[:3], out.stride(0), out.stride(1))
    variant = COMBINE_VARIANT
    if variant == "auto":
        variant = "blocked" if S >= BLOCKED_COMBINE_MIN_SPLITS else "serial"
    if variant == "blocked":
        block_d = 512 if interpreting() else 128
        _k._combine_blocked_kernel[(T, H, D_LATENT // block_d)](
            plan.partial_out, plan.partial_lse, out, lse_arg, *strides, H, S,
            SPLITS_POW2=triton_next_pow2(S), BLOCK_S=min(16, triton_next_pow2(S)), BLOCK_D=block_d,
            WRITE_LSE=lse is not None, num_warps=4,
        )
    elif variant == "serial":
        _k._combine_kernel[(T, H)](
            plan.partial_out, plan.partial_lse, out, lse_arg, *strides, H, S,
            SPLITS_POW2=triton_next_pow2(S), WRITE_LSE=lse is not None, num_warps=4,
        )
    else:
        raise ValueError(f"LIGHTSPEED_MLA_COMBINE must be auto or one of {COMBINE_VARIANTS}, got {variant!r}")


def triton_next_pow2(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def mla_decode(
    q: torch.Tensor,
    cache: MLACache,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    **plan_overrides,
):
    """One-shot absorbed MLA attention (plans and runs; allocates: not for CUDA graphs).

    Same tensors as :func:`plan_decode` / :func:`run_decode`; seq_lens and query_start_loc may
    live on any device (they are read on the host here). Returns out, or (out, lse).
    """
    T, H = q.shape[0], q.shape[1]
    qsl, lens = _host_i32(query_start_loc), _host_i32(seq_lens)
    B = lens.shape[0]
    max_q = int(np.diff(qsl).max()) if B else 0
    splits = plan_overrides.get("num_splits") or _layout(
        B, max_q, int(lens.max()) if B else 0, H, device_info(q.device), cache.kind,
        plan_overrides.get("fold"), plan_overrides.get("tile"))[4]
    ws = torch.empty(decode_workspace_bytes(B, T, H, splits), dtype=torch.uint8, device=q.device)
    query_start_loc, seq_lens = qsl, lens
    plan = plan_decode(ws, query_start_loc, seq_lens, H, page_size=cache.page_size,
                       softmax_scale=softmax_scale, cache_kind=cache.kind, **plan_overrides)
    out = out if out is not None else torch.empty(T, H, D_LATENT, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device) if return_lse else None
    run_decode(plan, q, cache, page_table, out, lse)
    return (out, lse) if return_lse else out
