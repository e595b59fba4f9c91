"""Ops made of other ops: the default of a fused op family until a fused kernel measures faster.

`norm/rms_linear` (a decoder block's norm and the projection after it) and
`activation/silu_and_mul_linear` (an MLP's gated activation and its down projection) run as the two
ops they fuse, each dispatched to its own best kernel (the CPU's native kernels, cuBLAS or the skinny
GEMM), so a model that calls the fused op behaves exactly as one that calls the two. Fused kernels
register in the same families (`triton/norm_gemv.py`, `triton/act_gemv.py`) and take over only when
selected or ranked above these.
"""

from __future__ import annotations

import torch

from . import ops
from .registry import Priority, register_kernel


@register_kernel("norm", "rms_linear", name="composed_rms_norm_linear", solution="composed",
                 priority=Priority.of(Priority.PORTABLE, 1), capability="any")
def rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_add_rms_norm`` (``rms_norm`` without a residual) then ``linear``."""
    if residual is None:
        normed, h = ops.rms_norm(x, norm_weight, eps), x
    else:
        normed, h = ops.fused_add_rms_norm(x, residual, norm_weight, eps)
    return ops.linear(normed, weight, bias), h


@register_kernel("activation", "silu_and_mul_linear", name="composed_silu_and_mul_linear", solution="composed",
                 priority=Priority.of(Priority.PORTABLE, 1), capability="any")
def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu_and_mul`` then ``linear``."""
    return ops.linear(ops.silu_and_mul(x), weight, bias)
