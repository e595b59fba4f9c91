"""RMS norm and fused residual-add + RMS norm: one program per row, fp32 statistics."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    FLOAT_DTYPES,
    check,
    check_dtype,
    check_last_contiguous,
    next_pow2,
    pdl_args,
    pdl_enter,
    register,
)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    stride_x,
    stride_res,
    stride_out,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_res + cols, summed, mask=mask)
        # normalise the rounded sum, exactly what the next layer will read back as residual
        x = summed.to(tl.float32)
    var = tl.sum(x * x, axis=0) / n_cols
    inv = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x * inv * w).to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps, out, num_warps=None):
    check(x.dim() == 2, f"x must be [T, H], got {tuple(x.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    t, h = x.shape
    check(weight.shape == (h,), f"weight must be [{h}], got {tuple(weight.shape)}")
    check_last_contiguous("x", x)
    check(weight.is_contiguous(), "weight must be contiguous")
    if out is None:
        out = torch.empty_like(x)
    check(out.shape == x.shape, "out shape mismatch")
    check_last_contiguous("out", out)
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x")
        check_last_contiguous("residual", residual)
    if t == 0:
        return out
    block = next_pow2(h)
    if num_warps is None:
        # H200 sweep (bench/results/kernels_2026-11-29_h200.md), H = 4096: 4 warps 87.6% of HBM, 8 warps 80.6%
        num_warps = 4 if block <= 4096 else (8 if block <= 8192 else 16)
    _rms_norm_kernel[(t,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        h,
        x.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        float(eps),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=num_warps,
        **pdl_args(x.device),
    )
    return out


@register("norm", "rms", "triton_rms_norm", FLOAT_DTYPES)
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None):
    """y = x / sqrt(mean(x^2) + eps) * weight. x: [T, H], weight: [H] -> [T, H] (x's dtype)."""
    return _launch(x, None, weight, eps, out)


@register("norm", "fused_add_rms", "triton_fused_add_rms_norm", FLOAT_DTYPES)
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """new_residual = x + residual (written into `residual` in place); normed = rms_norm(new_residual).

    x, residual: [T, H] -> (normed [T, H], new_residual [T, H] (the same storage as `residual`)).
    """
    out = _launch(x, residual, weight, eps, None)
    return out, residual
