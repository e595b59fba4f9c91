"""GEMM references: bf16/fp16/fp32 linear through torch, fp8 block-scaled by dequantise-then-matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._register import reference

FP8_BLOCK = 128


@reference("gemm", "bf16")
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # x: [T, K], weight: [N, K], bias: [N] -> [T, N]
    return F.linear(x, weight, bias)


def _expand_scale(scale: torch.Tensor, rows: int, cols: int, row_block: int, col_block: int) -> torch.Tensor:
    return scale.repeat_interleave(row_block, dim=0)[:rows].repeat_interleave(col_block, dim=1)[:, :cols]


@reference("gemm", "fp8_block")
def fp8_block_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    # a: [M, K] e4m3, a_scale: [M, ceil(K/128)] (per token, per 128 columns)
    # b: [N, K] e4m3, b_scale: [ceil(N/128), ceil(K/128)] (per 128x128 block) -> [M, N] out_dtype
    m, k = a.shape
    n = b.shape[0]
    if b.shape[1] != k:
        raise ValueError(f"fp8_block_gemm: a is [{m}, {k}] but b is {list(b.shape)}")
    a_deq = a.float() * _expand_scale(a_scale.float(), m, k, 1, FP8_BLOCK)
    b_deq = b.float() * _expand_scale(b_scale.float(), n, k, FP8_BLOCK, FP8_BLOCK)
    return (a_deq @ b_deq.t()).to(out_dtype)
