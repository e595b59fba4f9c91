"""FP8 quantisation ops (family ``quantize``): scale = amax / 448, q = x / scale in e4m3.
Dispatch dtype: ``x.dtype``."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def quant_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H] -> (q [T, H] e4m3, scale [T, 1] fp32) (quantize/fp8_per_token)."""
    return impl_for("quantize", "fp8_per_token", x)(x)


def quant_fp8_per_block(x: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, H] -> (q [T, H] e4m3, scale [T, ceil(H/block)] fp32) (quantize/fp8_per_block)."""
    return impl_for("quantize", "fp8_per_block", x)(x, block)


def quant_fp8_per_token_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [T, Hh, D] -> (q [T, Hh, D] e4m3, scale [T, Hh] fp32) (quantize/fp8_per_token_head)."""
    return impl_for("quantize", "fp8_per_token_head", x)(x)
