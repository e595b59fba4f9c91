"""Gated activations on a fused `[gate ‖ up]` projection."""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn


class SiluAndMul(nn.Module):
    """`silu(x[:, :I]) * x[:, I:]`: [T, 2I] -> [T, I]. Shard(-1) in, Shard(-1) out (local)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)
