"""FP8 e4m3 dynamic quantisation: per token, per 128-wide block, per (token, head).

All three are one kernel over groups: a program reads one group, takes amax, writes
q = clamp(x / scale) with scale = max(amax, eps) / 448 (fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, FP8_E4M3_MAX, check, check_dtype, interpreting, register

EPS = 1e-10  # amax floor, as the reference: an all-zero group gets a tiny finite scale


@triton.jit
def snap_to_e4m3(q):
    """Round fp32 values (|q| <= 448) to the nearest e4m3 value (3 mantissa bits, subnormal step 2^-9).

    Only for the interpreter: Triton's CPU cast to e4m3 rounds imperfectly and drops the exponent
    carry (127.7 -> 64), so snapped values make the cast exact there; GPUs cast correctly."""
    mag = tl.abs(q)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1.0 / 512.0))), -6.0)
    step = tl.exp2(e - 3.0)
    return tl.where(q < 0, -1.0, 1.0) * tl.floor(mag / step + 0.5) * step


@triton.jit
def _quant_group_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    n_cols,
    group,
    groups_per_row,
    stride_xr,
    stride_qr,
    eps,
    FP8_MAX: tl.constexpr,
    BLOCK: tl.constexpr,
    ROUND_TO_E4M3: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // groups_per_row
    g = pid % groups_per_row
    cols = tl.arange(0, BLOCK)
    mask = (cols < group) & (g * group + cols < n_cols)  # a ragged last block is its own group
    x = tl.load(x_ptr + row * stride_xr + g * group + cols, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    scale = tl.maximum(amax, eps) / FP8_MAX
    q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
    if ROUND_TO_E4M3:
        q = snap_to_e4m3(q)
    tl.store(q_ptr + row * stride_qr + g * group + cols, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(s_ptr + pid, scale)


def _quant_rows(x2d: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x2d: [R, C] rows (last dim contiguous) -> (q [R, C] e4m3, scale [R, ceil(C/group)] fp32)."""
    r, c = x2d.shape
    groups = triton.cdiv(c, group) if c else 0
    q = torch.empty((r, c), dtype=torch.float8_e4m3fn, device=x2d.device)
    s = torch.empty((r, groups), dtype=torch.float32, device=x2d.device)
    if r == 0 or c == 0:
        return q, s
    block = triton.next_power_of_2(group)
    _quant_group_kernel[(r * groups,)](
        x2d,
        q,
        s,
        c,
        group,
        groups,
        x2d.stride(0),
        q.stride(0),
        EPS,
        FP8_MAX=FP8_E4M3_MAX,
        BLOCK=block,
        ROUND_TO_E4M3=interpreting(),
        num_warps=4 if block <= 2048 else 8,
    )
    return q, s


def _check(x: torch.Tensor, dims: int) -> None:
    check(x.dim() == dims, f"x must have {dims} dims, got {tuple(x.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)


@register("quantize", "fp8_per_token", "triton_quant_fp8_per_token", FLOAT_DTYPES)
def quant_fp8_per_token(x: torch.Tensor):
    """x: [T, H] -> (q e4m3 [T, H], scale fp32 [T, 1]); x ≈ q * scale."""
    _check(x, 2)
    x = x.contiguous()
    return _quant_rows(x, x.shape[1])


@register("quantize", "fp8_per_block", "triton_quant_fp8_per_block", FLOAT_DTYPES)
def quant_fp8_per_block(x: torch.Tensor, block: int = 128):
    """x: [T, H] -> (q e4m3 [T, H], scale fp32 [T, ceil(H/block)]); a ragged last block is a group."""
    _check(x, 2)
    check(block > 0, "block must be positive")
    return _quant_rows(x.contiguous(), block)


@register("quantize", "fp8_per_token_head", "triton_quant_fp8_per_token_head", FLOAT_DTYPES)
def quant_fp8_per_token_head(x: torch.Tensor):
    """x: [T, Hh, D] -> (q e4m3 [T, Hh, D], scale fp32 [T, Hh])."""
    _check(x, 3)
    t, hh, d = x.shape
    q, s = _quant_rows(x.contiguous().view(t, hh * d), d)
    return q.view(t, hh, d), s
