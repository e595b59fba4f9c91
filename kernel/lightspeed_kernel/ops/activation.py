"""Gated activation ops (family ``activation``). Dispatch dtype: ``x.dtype``."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` for x = [gate | up]: [T, 2I] -> [T, I] (activation/silu_and_mul);
    ``out``: optional [T, I] destination."""
    return impl_for("activation", "silu_and_mul", x)(x, out=out)


def gelu_and_mul(
    x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``gelu(gate) * up`` for x = [gate | up]: [T, 2I] -> [T, I]; approximate "none" (erf) or
    "tanh" (activation/gelu_and_mul); ``out``: optional [T, I] destination."""
    return impl_for("activation", "gelu_and_mul", x)(x, approximate, out=out)


def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """An MLP's gated activation and the projection after it (activation/silu_and_mul_linear):
    ``silu_and_mul(x) @ weight.T + bias``. x: [T, 2I]; weight: [N, I]; bias: [N] -> [T, N]. The default
    composes ``silu_and_mul`` and ``linear``."""
    return impl_for("activation", "silu_and_mul_linear", x)(x, weight, bias)
