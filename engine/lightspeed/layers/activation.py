"""Gated activations on a fused `[gate ‖ up]` projection."""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .linear import UNQUANTIZED


class SiluAndMul(nn.Module):
    """`silu(x[:, :I]) * x[:, I:]`: [T, 2I] -> [T, I]. Shard(-1) in, Shard(-1) out (local)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)

    def then_linear(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`linear(self(x))` as one op (ops.silu_and_mul_linear: a kernel may fold the activation into
        a one-row projection; its default composes the same two ops). A quantized or tensor-parallel
        projection: the activation, then the layer."""
        if linear.scheme is UNQUANTIZED and linear.parallel.tp_size == 1:
            return ops.silu_and_mul_linear(x, linear.weight, linear.bias)
        return linear(self(x))
