"""Fused MoE experts: grouped GEMMs over token->expert pairs sorted by expert.

Design note. The T*k (token, expert) pairs are sorted by expert and each expert's run is padded to a
multiple of BLOCK_M (`align_pairs`, torch ops on the device: no host sync, so it can be captured in
a CUDA graph; the grid is sized by the worst case and surplus blocks exit at once). A block of BLOCK_M
pairs therefore belongs to one expert, and
- GEMM 1 gathers the pairs' token rows of x, multiplies by the expert's gate and up rows of w13 in
  one program (two accumulators) and writes act(gate) * up: the activation is fused, the [T*k, 2I]
  intermediate never exists;
- GEMM 2 multiplies that by the expert's w2 and scales by the routing weight into a [T*k, H] fp32
  buffer, summed over k afterwards (deterministic, no atomics).
Rounding mirrors the reference: each GEMM output is rounded to x's dtype before the next step.
At decode sizes each expert's weights are read once per column tile, so the kernel is bound by the
active experts' weight bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check, dot_precision, dot_upcast, interpreting, register
from .activation import ACT_GELU, ACT_SILU, apply_act


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """topk_ids: [T, k] -> (sorted_pairs int32 [cap] (pair id = t * k + j, padding = T*k),
    block_expert int32 [cap / block_m]: the expert of each block, num_experts for blocks of skipped
    pairs (id < 0: an expert held by another rank under expert parallelism), num_experts + 1 for
    blocks past the end)."""
    flat = topk_ids.reshape(-1).long()
    n_pairs = flat.numel()
    device = flat.device
    flat = torch.where(flat < 0, num_experts, flat)  # skipped pairs form one more bucket, sorted last
    # scatter_add, not bincount: bincount on CUDA reads the max id back to the host (a sync that
    # breaks CUDA-graph capture)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    order = torch.argsort(flat, stable=True)
    sorted_expert = flat[order]
    unpadded_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(n_pairs, device=device) - unpadded_start[sorted_expert]
    dest = padded_start[sorted_expert] + rank
    # at most min(E + 1, T*k) buckets are non-empty, each padded by < block_m
    capacity = triton.cdiv(n_pairs + min(num_experts + 1, n_pairs) * (block_m - 1), block_m) * block_m
    sorted_pairs = torch.full((capacity,), n_pairs, dtype=torch.int32, device=device)
    sorted_pairs[dest] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True).to(torch.int32)
    return sorted_pairs, block_expert


@triton.jit
def _moe_gemm1_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    pairs_ptr,
    block_expert_ptr,
    n_pairs,
    top_k,
    hidden,
    inter,
    n_experts,
    stride_xt,
    stride_we,
    stride_wn,
    stride_ot,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk)
    if expert < n_experts:
        pairs = tl.load(pairs_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < n_pairs
        tokens = (pairs // top_k).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < inter
        offs_k = tl.arange(0, BLOCK_K)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        gate_rows = w_base + offs_n.to(tl.int64)[:, None] * stride_wn
        up_rows = w_base + (offs_n + inter).to(tl.int64)[:, None] * stride_wn
        x_rows = x_ptr + tokens[:, None] * stride_xt
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            k = k0 + offs_k
            k_mask = k < hidden
            a = tl.load(x_rows + k[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
            wg = tl.load(gate_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            wu = tl.load(up_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            if DOT_UPCAST:
                a = a.to(tl.float32)
                wg = wg.to(tl.float32)
                wu = wu.to(tl.float32)
            acc_gate += tl.dot(a, tl.trans(wg), input_precision=PRECISION)
            acc_up += tl.dot(a, tl.trans(wu), input_precision=PRECISION)
        # round like the reference: x @ w13.T lands in x's dtype before the activation
        gate = acc_gate.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        h = apply_act(gate, ACT) * up
        optr = out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + offs_n[None, :]
        tl.store(optr, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _moe_gemm2_kernel(
    h_ptr,
    w_ptr,
    out_ptr,
    weights_ptr,
    pairs_ptr,
    block_expert_ptr,
    n_pairs,
    hidden,
    inter,
    n_experts,
    stride_ht,
    stride_we,
    stride_wn,
    stride_ot,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk)
    if expert < n_experts:
        pairs = tl.load(pairs_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = pairs < n_pairs
        rows = pairs.to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hidden
        offs_k = tl.arange(0, BLOCK_K)
        w_rows = w_ptr + expert.to(tl.int64) * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
        h_rows = h_ptr + rows[:, None] * stride_ht
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, inter, BLOCK_K):
            k = k0 + offs_k
            k_mask = k < inter
            a = tl.load(h_rows + k[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            if DOT_UPCAST:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(a, tl.trans(w), input_precision=PRECISION)
        routed = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
        y = acc.to(h_ptr.dtype.element_ty).to(tl.float32) * routed[:, None]
        tl.store(
            out_ptr + rows[:, None] * stride_ot + offs_n[None, :], y, mask=valid[:, None] & n_mask[None, :]
        )
    elif expert == n_experts:  # skipped pairs (expert on another rank): they add zero to the sum over k
        _store_zero_rows(out_ptr, pairs_ptr, blk, n_pairs, hidden, stride_ot, BLOCK_M, BLOCK_N)


@triton.jit
def _store_zero_rows(out_ptr, pairs_ptr, blk, n_pairs, hidden, stride_ot, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    pairs = tl.load(pairs_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < n_pairs
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    zeros = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    tl.store(out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + offs_n[None, :], zeros,
             mask=valid[:, None] & (offs_n < hidden)[None, :])


def _choose_tiles(n_pairs: int, num_experts: int):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) by how many pairs each expert gets."""
    if interpreting():
        return 16, 32, 32, 4, 1
    per_expert = n_pairs / max(1, num_experts)
    if per_expert <= 16:  # decode: weight-bandwidth bound, small M tile
        return 16, 64, 128, 4, 4
    if per_expert <= 64:
        return 32, 128, 64, 4, 4
    return 64, 128, 64, 8, 3


@register("moe", "fused_experts", "triton_fused_experts", FLOAT_DTYPES)
def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    _tiles: tuple | None = None,
) -> torch.Tensor:
    """x: [T, H]; w13: [E, 2I, H] (gate rows, then up rows); w2: [E, H, I]; topk_weights: [T, k];
    topk_ids: [T, k] -> [T, H] = sum_j topk_weights[:, j] * w2_e(act(gate) * up)."""
    check(activation in ("silu", "gelu"), f"activation must be 'silu' or 'gelu', got {activation!r}")
    check(x.dim() == 2 and w13.dim() == 3 and w2.dim() == 3, "x [T, H], w13 [E, 2I, H], w2 [E, H, I]")
    t, hidden = x.shape
    n_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    check(w13.shape == (n_experts, 2 * inter, hidden), f"w13 must be [E, 2I, {hidden}]")
    check(w2.shape == (n_experts, hidden, inter), f"w2 must be [{n_experts}, {hidden}, {inter}]")
    check(topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == t, "topk_ids/weights must be [T, k]")
    check(
        x.dtype in FLOAT_DTYPES and w13.dtype == x.dtype and w2.dtype == x.dtype, "x, w13, w2 share a dtype"
    )
    check(x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "last dims must be contiguous")
    top_k = topk_ids.shape[1]
    n_pairs = t * top_k
    if n_pairs == 0:
        return torch.zeros_like(x)
    # _tiles: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), for the benchmark's tile sweep
    block_m, block_n, block_k, warps, stages = _tiles or _choose_tiles(n_pairs, n_experts)
    if _tiles is None and x.dtype == torch.float32:
        stages = min(stages, 2)  # 4-byte tiles: keep the pipelined buffers inside 227 KB of shared memory
    sorted_pairs, block_expert = align_pairs(topk_ids, n_experts, block_m)
    n_blocks = block_expert.numel()
    hmid = torch.empty((n_pairs, inter), dtype=x.dtype, device=x.device)
    _moe_gemm1_kernel[(n_blocks, triton.cdiv(inter, block_n))](
        x,
        w13,
        hmid,
        sorted_pairs,
        block_expert,
        n_pairs,
        top_k,
        hidden,
        inter,
        n_experts,
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        hmid.stride(0),
        ACT=ACT_SILU if activation == "silu" else ACT_GELU,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_UPCAST=dot_upcast(),
        PRECISION=dot_precision(x.dtype),
        num_warps=warps,
        num_stages=stages,
    )
    weights = topk_weights.reshape(-1).contiguous()
    partial = torch.empty((n_pairs, hidden), dtype=torch.float32, device=x.device)
    _moe_gemm2_kernel[(n_blocks, triton.cdiv(hidden, block_n))](
        hmid,
        w2,
        partial,
        weights,
        sorted_pairs,
        block_expert,
        n_pairs,
        hidden,
        inter,
        n_experts,
        hmid.stride(0),
        w2.stride(0),
        w2.stride(1),
        partial.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_UPCAST=dot_upcast(),
        PRECISION=dot_precision(x.dtype),
        num_warps=warps,
        num_stages=stages,
    )
    return partial.view(t, top_k, hidden).sum(dim=1).to(x.dtype)
