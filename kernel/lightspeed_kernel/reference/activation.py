"""Gated activations: act(gate) * up for x = [gate | up] along the last dim; fp32 math."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._register import reference


@reference("activation", "silu_and_mul")
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    # x: [T, 2I] -> [T, I]
    half = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :half]) * xf[..., half:]).to(x.dtype)


@reference("activation", "gelu_and_mul")
def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    # x: [T, 2I] -> [T, I]; approximate: "none" (erf) or "tanh"
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    half = x.shape[-1] // 2
    xf = x.float()
    return (F.gelu(xf[..., :half], approximate=approximate) * xf[..., half:]).to(x.dtype)
