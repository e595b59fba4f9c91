"""Gated activations: act(gate) * up for x = [gate | up] along the last dim; fp32 math."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._register import reference


def _emit(result: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    return result.to(dtype) if out is None else out.copy_(result)


@reference("activation", "silu_and_mul")
def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    # x: [T, 2I] -> [T, I] (written into `out` when given)
    half = x.shape[-1] // 2
    xf = x.float()
    return _emit(F.silu(xf[..., :half]) * xf[..., half:], x.dtype, out)


@reference("activation", "gelu_and_mul")
def gelu_and_mul(
    x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None
) -> torch.Tensor:
    # x: [T, 2I] -> [T, I]; approximate: "none" (erf) or "tanh"
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    half = x.shape[-1] // 2
    xf = x.float()
    return _emit(F.gelu(xf[..., :half], approximate=approximate) * xf[..., half:], x.dtype, out)


@reference("activation", "silu_and_mul_linear")
def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # The unfused numbers: the activation rounds to x's dtype, then the projection in fp32, rounded once.
    out = silu_and_mul(x).float() @ weight.float().t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
