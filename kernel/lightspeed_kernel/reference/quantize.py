"""FP8 (e4m3) quantisation references: scale = amax / 448 per group, q = round(x / scale).

The amax is floored at FP8_AMAX_FLOOR so an all-zero group gets a tiny, finite scale.
"""

from __future__ import annotations

import torch

from ._register import reference

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
FP8_AMAX_FLOOR = 1e-10


def _quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # x: [..., G] fp32 groups along the last dim -> (q [..., G] e4m3, scale [..., 1] fp32)
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=FP8_AMAX_FLOOR) / FP8_MAX
    q = (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


@reference("quantize", "fp8_per_token")
def quant_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # x: [T, H] -> (q [T, H] e4m3, scale [T, 1] fp32)
    return _quantize_groups(x.float())


@reference("quantize", "fp8_per_block")
def quant_fp8_per_block(x: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    # x: [T, H] -> (q [T, H] e4m3, scale [T, ceil(H/block)] fp32); a ragged last block is its own group
    t, h = x.shape
    blocks = -(-h // block)
    padded = torch.zeros(t, blocks * block, dtype=torch.float32, device=x.device)
    padded[:, :h] = x.float()
    q, scale = _quantize_groups(padded.view(t, blocks, block))
    return q.view(t, blocks * block)[:, :h].contiguous(), scale.view(t, blocks)


@reference("quantize", "fp8_per_token_head")
def quant_fp8_per_token_head(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # x: [T, Hh, D] -> (q [T, Hh, D] e4m3, scale [T, Hh] fp32)
    q, scale = _quantize_groups(x.float())
    return q, scale.squeeze(-1)
