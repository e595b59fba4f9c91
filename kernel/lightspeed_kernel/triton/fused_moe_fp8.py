"""Fused MoE experts over FP8 block-scaled weights (DeepSeek-V3's checkpoint format).

Design note. The structure is `fused_moe.py`'s: (token, expert) pairs sorted by expert and padded
to BLOCK_M per expert (`align_pairs`), GEMM 1 with the activation fused (gate and up accumulators
in one program), GEMM 2 scaled by the routing weight into an fp32 [T*k, H] buffer summed over k.
What changes is the operands: weights are e4m3 with one fp32 scale per 128x128 block, and the
activations are quantised per token and 128 columns (x once per token before GEMM 1, the
intermediate once per pair before GEMM 2) so both MMA operands are e4m3. BLOCK_K is the 128 of
the scale grid: every K step is one e4m3 dot rescaled by `a_scale[row, kb] * w_scale[n // 128, kb]`
into the fp32 accumulator, the same arithmetic as `gemm/fp8_block`. BLOCK_N divides 128, so the
weight scale of a column is `(n0 + j) // 128`. At decode sizes each active expert's e4m3 bytes
are read once per column tile: half the bytes of the bf16 kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check, dot_upcast, interpreting, register
from .activation import ACT_GELU, ACT_SILU, apply_act
from .fused_moe import _store_zero_rows, align_pairs
from .quantize import quant_fp8_per_block

SCALE_BLOCK = 128


@triton.jit
def _fp8_moe_gemm1_kernel(
    xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, pairs_ptr, block_expert_ptr,
    n_pairs, top_k, hidden, inter, n_experts,
    stride_xt, stride_xst, stride_we, stride_wn, stride_wse, stride_wsn, stride_ot,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
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
        ws_base = ws_ptr + expert.to(tl.int64) * stride_wse
        gate_rows = w_base + offs_n.to(tl.int64)[:, None] * stride_wn
        up_rows = w_base + (offs_n + inter).to(tl.int64)[:, None] * stride_wn
        gate_srow = ws_base + (offs_n // BLOCK_K).to(tl.int64) * stride_wsn
        up_srow = ws_base + ((offs_n + inter) // BLOCK_K).to(tl.int64) * stride_wsn
        x_rows = xq_ptr + tokens[:, None] * stride_xt
        xs_rows = xs_ptr + tokens * stride_xst
        acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kb in range(0, tl.cdiv(hidden, BLOCK_K)):
            k = kb * BLOCK_K + offs_k
            k_mask = k < hidden
            a = tl.load(x_rows + k[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
            wg = tl.load(gate_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            wu = tl.load(up_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            a_s = tl.load(xs_rows + kb, mask=valid, other=0.0)
            g_s = tl.load(gate_srow + kb, mask=n_mask, other=0.0)
            u_s = tl.load(up_srow + kb, mask=n_mask, other=0.0)
            if DOT_UPCAST:
                a = a.to(tl.float32)
                wg = wg.to(tl.float32)
                wu = wu.to(tl.float32)
            acc_gate += tl.dot(a, tl.trans(wg)) * a_s[:, None] * g_s[None, :]
            acc_up += tl.dot(a, tl.trans(wu)) * a_s[:, None] * u_s[None, :]
        # round like the reference: the GEMM output lands in the activation dtype first
        gate = acc_gate.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_up.to(out_ptr.dtype.element_ty).to(tl.float32)
        h = apply_act(gate, ACT) * up
        optr = out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + offs_n[None, :]
        tl.store(optr, h.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _fp8_moe_gemm2_kernel(
    hq_ptr, hs_ptr, w_ptr, ws_ptr, out_ptr, weights_ptr, pairs_ptr, block_expert_ptr,
    n_pairs, hidden, inter, n_experts,
    stride_ht, stride_hst, stride_we, stride_wn, stride_wse, stride_wsn, stride_ot,
    ROUND_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_UPCAST: tl.constexpr,
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
        ws_row = ws_ptr + expert.to(tl.int64) * stride_wse + (offs_n // BLOCK_K).to(tl.int64) * stride_wsn
        h_rows = hq_ptr + rows[:, None] * stride_ht
        hs_rows = hs_ptr + rows * stride_hst
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kb in range(0, tl.cdiv(inter, BLOCK_K)):
            k = kb * BLOCK_K + offs_k
            k_mask = k < inter
            a = tl.load(h_rows + k[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            a_s = tl.load(hs_rows + kb, mask=valid, other=0.0)
            w_s = tl.load(ws_row + kb, mask=n_mask, other=0.0)
            if DOT_UPCAST:
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            acc += tl.dot(a, tl.trans(w)) * a_s[:, None] * w_s[None, :]
        routed = tl.load(weights_ptr + rows, mask=valid, other=0.0).to(tl.float32)
        y = acc.to(ROUND_DTYPE).to(tl.float32) * routed[:, None]
        tl.store(out_ptr + rows[:, None] * stride_ot + offs_n[None, :], y, mask=valid[:, None] & n_mask[None, :])
    elif expert == n_experts:  # skipped pairs (expert on another rank): they add zero to the sum over k
        _store_zero_rows(out_ptr, pairs_ptr, blk, n_pairs, hidden, stride_ot, BLOCK_M, BLOCK_N)


def _choose_tiles(n_pairs: int, num_experts: int):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); BLOCK_N divides the 128 of the scale grid."""
    if interpreting():
        return 16, 32, 4, 1
    per_expert = n_pairs / max(1, num_experts)
    if per_expert <= 16:  # decode: weight-bandwidth bound
        return 16, 64, 4, 4
    if per_expert <= 64:
        return 32, 128, 4, 3
    return 64, 128, 8, 3


_TL_DTYPE = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _check_operands(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids) -> tuple[int, int, int, int]:
    check(x.dim() == 2 and w13.dim() == 3 and w2.dim() == 3, "x [T, H], w13 [E, 2I, H], w2 [E, H, I]")
    t, hidden = x.shape
    n_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    check(w13.shape == (n_experts, 2 * inter, hidden), f"w13 must be [E, 2I, {hidden}]")
    check(w2.shape == (n_experts, hidden, inter), f"w2 must be [{n_experts}, {hidden}, {inter}]")
    check(w13.dtype == torch.float8_e4m3fn and w2.dtype == torch.float8_e4m3fn, "w13 and w2 must be e4m3")
    cd = triton.cdiv
    want13 = (n_experts, cd(2 * inter, SCALE_BLOCK), cd(hidden, SCALE_BLOCK))
    want2 = (n_experts, cd(hidden, SCALE_BLOCK), cd(inter, SCALE_BLOCK))
    check(w13_scale.shape == want13 and w13_scale.dtype == torch.float32, f"w13_scale must be fp32 {list(want13)}")
    check(w2_scale.shape == want2 and w2_scale.dtype == torch.float32, f"w2_scale must be fp32 {list(want2)}")
    check(topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == t, "topk_ids/weights must be [T, k]")
    check(x.dtype in FLOAT_DTYPES, f"x must be one of {FLOAT_DTYPES}")
    check(w13.stride(2) == 1 and w2.stride(2) == 1 and w13_scale.stride(2) == 1 and w2_scale.stride(2) == 1,
          "last dims must be contiguous")
    return t, hidden, inter, n_experts


@register("moe", "fused_experts_fp8", "triton_fused_experts_fp8", FLOAT_DTYPES, min_cc=(8, 9))
def fused_experts_fp8(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
) -> torch.Tensor:
    """x: [T, H]; w13: e4m3 [E, 2I, H], w13_scale fp32 [E, ceil(2I/128), ceil(H/128)]; w2: e4m3 [E, H, I],
    w2_scale [E, ceil(H/128), ceil(I/128)]; topk_weights / topk_ids: [T, k] -> [T, H] in x's dtype."""
    check(activation in ("silu", "gelu"), f"activation must be 'silu' or 'gelu', got {activation!r}")
    t, hidden, inter, n_experts = _check_operands(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids)
    top_k = topk_ids.shape[1]
    n_pairs = t * top_k
    if n_pairs == 0:
        return torch.zeros_like(x)
    block_m, block_n, warps, stages = _choose_tiles(n_pairs, n_experts)
    sorted_pairs, block_expert = align_pairs(topk_ids, n_experts, block_m)
    n_blocks = block_expert.numel()
    xq, xs = quant_fp8_per_block(x.contiguous(), SCALE_BLOCK)  # [T, H] e4m3, [T, H/128]
    hmid = torch.empty((n_pairs, inter), dtype=x.dtype, device=x.device)
    _fp8_moe_gemm1_kernel[(n_blocks, triton.cdiv(inter, block_n))](
        xq, xs, w13, w13_scale, hmid, sorted_pairs, block_expert,
        n_pairs, top_k, hidden, inter, n_experts,
        xq.stride(0), xs.stride(0), w13.stride(0), w13.stride(1), w13_scale.stride(0), w13_scale.stride(1),
        hmid.stride(0),
        ACT=ACT_SILU if activation == "silu" else ACT_GELU, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=SCALE_BLOCK, DOT_UPCAST=dot_upcast(), num_warps=warps, num_stages=stages,
    )
    hq, hs = quant_fp8_per_block(hmid, SCALE_BLOCK)  # [T*k, I] e4m3, [T*k, I/128]
    weights = topk_weights.reshape(-1).contiguous()
    partial = torch.empty((n_pairs, hidden), dtype=torch.float32, device=x.device)
    _fp8_moe_gemm2_kernel[(n_blocks, triton.cdiv(hidden, block_n))](
        hq, hs, w2, w2_scale, partial, weights, sorted_pairs, block_expert,
        n_pairs, hidden, inter, n_experts,
        hq.stride(0), hs.stride(0), w2.stride(0), w2.stride(1), w2_scale.stride(0), w2_scale.stride(1),
        partial.stride(0),
        ROUND_DTYPE=_TL_DTYPE[x.dtype], BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=SCALE_BLOCK,
        DOT_UPCAST=dot_upcast(), num_warps=warps, num_stages=stages,
    )
    return partial.view(t, top_k, hidden).sum(dim=1).to(x.dtype)
