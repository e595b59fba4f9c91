"""Gated activations: out = act(x[:, :I]) * x[:, I:], fp32 math, one row-tile per program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check, check_dtype, check_last_contiguous, pdl_args, pdl_enter, register

# act codes shared with the fused-MoE kernel
ACT_SILU = 0
ACT_GELU = 1
ACT_GELU_TANH = 2


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def apply_act(gate, ACT: tl.constexpr):
    """gate: fp32 tile. ACT 0 = silu, 1 = gelu (erf), 2 = gelu (tanh approximation)."""
    if ACT == 0:
        return gate * tl.sigmoid(gate)
    elif ACT == 1:
        return 0.5 * gate * (1.0 + tl.math.erf(gate * 0.7071067811865476))
    else:
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        return 0.5 * gate * (1.0 + _tanh(inner))


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_out, ACT: tl.constexpr, BLOCK: tl.constexpr,
                        USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = apply_act(gate, ACT) * up
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def act_and_mul(x: torch.Tensor, act: int, out: torch.Tensor | None = None) -> torch.Tensor:
    check(x.dim() == 2 and x.shape[1] % 2 == 0, f"x must be [T, 2I], got {tuple(x.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    check_last_contiguous("x", x)
    t, inter = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    check(out.shape == (t, inter), "out must be [T, I]")
    check_last_contiguous("out", out)
    if t == 0 or inter == 0:
        return out
    block = min(2048, triton.next_power_of_2(inter))
    grid = (t, triton.cdiv(inter, block))
    _act_and_mul_kernel[grid](
        x, out, inter, x.stride(0), out.stride(0), ACT=act, BLOCK=block, num_warps=4 if block <= 1024 else 8,
        **pdl_args(x.device),
    )
    return out


@register("activation", "silu_and_mul", "triton_silu_and_mul", FLOAT_DTYPES)
def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, 2I] -> silu(x[:, :I]) * x[:, I:]  [T, I]."""
    return act_and_mul(x, ACT_SILU, out)


@register("activation", "gelu_and_mul", "triton_gelu_and_mul", FLOAT_DTYPES)
def gelu_and_mul(
    x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x: [T, 2I] -> gelu(x[:, :I]) * x[:, I:]  [T, I]; approximate "none" (erf) or "tanh"."""
    check(approximate in ("none", "tanh"), f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return act_and_mul(x, ACT_GELU if approximate == "none" else ACT_GELU_TANH, out)
