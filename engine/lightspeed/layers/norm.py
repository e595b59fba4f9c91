"""RMSNorm over the last dimension (optionally fused with the residual add)."""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .linear import default_weight_loader


class RMSNorm(nn.Module):
    """`y = x / sqrt(mean(x²) + eps) · weight`; replicated weight `[H]`.

    `forward(x)` -> normed; `forward(x, residual)` -> `(normed(x + residual), x + residual)`, the
    pre-norm residual stream of a decoder layer in one kernel.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
