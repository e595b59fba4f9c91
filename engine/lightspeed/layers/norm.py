"""RMSNorm over the last dimension (optionally fused with the residual add)."""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .linear import UNQUANTIZED, default_weight_loader


class RMSNorm(nn.Module):
    """`y = x / sqrt(mean(x²) + eps) · weight`; replicated weight `[H]`.

    `forward(x)` -> normed; `forward(x, residual)` -> `(normed(x + residual), x + residual)`, the
    pre-norm residual stream of a decoder layer in one kernel. Under tensor parallelism the norms
    of the residual stream also carry its collectives (`boundary`, see placement.py).
    """

    boundary = None  # a residual-stream norm's collectives (placement.Boundary), set by the compiler

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.boundary is not None and residual is not None:
            return self.boundary.apply(self, x, residual)
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def start(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first norm of a residual stream: `(normed(x), residual)`; the residual is `x`, or
        its token shard when the stream is sharded."""
        if self.boundary is not None:
            return self.boundary.apply(self, x, None)
        return ops.rms_norm(x, self.weight, self.eps), x

    def then_linear(self, linear: nn.Module, x: torch.Tensor,
                    residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(linear(normed), residual)` of `self(x, residual)` (or `self.start(x)` when residual is None)
        as one op (ops.rms_norm_linear), so a kernel may fold the norm into the projection (batch-1
        decode: triton_rms_norm_gemv); its default composes the same two ops. Under tensor parallelism
        (the norm carries collectives) or for a quantized projection: the norm, then the layer."""
        if self.boundary is None and linear.scheme is UNQUANTIZED and linear.parallel.tp_size == 1:
            return ops.rms_norm_linear(x, residual, self.weight, self.eps, linear.weight, linear.bias)
        normed, residual = self.start(x) if residual is None else self(x, residual)
        return linear(normed), residual

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
