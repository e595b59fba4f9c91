"""GEMM ops (family ``gemm``). Dispatch dtype: ``x.dtype`` / ``a.dtype`` (float8_e4m3fn)."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: x [T, K], weight [N, K], bias [N] -> [T, N] (gemm/bf16)."""
    return impl_for("gemm", "bf16", x)(x, weight, bias)


def fp8_block_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Block-scaled fp8 GEMM (DeepSeek-V3 style), gemm/fp8_block.

    a: [M, K] e4m3 with a_scale [M, K/128] fp32 (per token and 128 columns); b: [N, K] e4m3 with
    b_scale [N/128, K/128] fp32 (per 128×128 block; ragged edges round up).
    Returns ``(a·a_scale) @ (b·b_scale).T`` as [M, N] ``out_dtype``.
    """
    return impl_for("gemm", "fp8_block", a)(a, a_scale, b, b_scale, out_dtype=out_dtype)
