"""RMSNorm ops (family ``norm``). Dispatch dtype: ``x.dtype``."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x / sqrt(mean(x², -1) + eps) * weight`` (norm/rms).

    x: [T, H]; weight: [H]; out: optional [T, H] destination. Returns [T, H] in x's dtype.
    """
    return impl_for("norm", "rms", x)(x, weight, eps, out=out)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``new_residual = x + residual; normed = rms_norm(new_residual)`` (norm/fused_add_rms).

    x, residual: [T, H]; weight: [H]. Returns (normed [T, H], new_residual [T, H]); implementations
    may write new_residual into ``residual``: use the returned tensors.
    """
    return impl_for("norm", "fused_add_rms", x)(x, residual, weight, eps)


def rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A pre-norm block's norm and the projection after it (norm/rms_linear):
    ``h = x + residual`` (``h = x`` when residual is None); ``out = rms_norm(h) @ weight.T + bias``.

    x, residual: [T, H]; norm_weight: [H]; weight: [N, H]; bias: [N]. Returns (out [T, N], h [T, H]);
    implementations may write h into ``residual``: use the returned tensors. The default composes
    ``fused_add_rms_norm`` (or ``rms_norm``) and ``linear``; a fused kernel may skip the rounding of the
    normed activations between the two.
    """
    return impl_for("norm", "rms_linear", x)(x, residual, norm_weight, eps, weight, bias)
