"""GEMM ops (family ``gemm``). Dispatch dtype: ``x.dtype`` / ``a.dtype`` (float8_e4m3fn) /
``scales.dtype`` (dequantisation)."""

from __future__ import annotations

import torch

from ..quantized_weight import QuantizedWeight
from ._dispatch import impl_for


def linear(
    x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T + bias``: x [T, K], weight [N, K], bias [N] -> [T, N] (gemm/bf16; a
    :class:`QuantizedWeight` goes to gemm/w4 or gemm/w8)."""
    if type(weight) is QuantizedWeight or isinstance(weight, QuantizedWeight):
        mode = "w4" if weight.bits == 4 else "w8"
        return impl_for("gemm", mode, x)(x, weight.qweight, weight.scales, weight.mins, bias,
                                         group_size=weight.group_size)
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


# -- weight-only quantised (w4 / w8; the format is lightspeed_kernel.quantized_weight) ---------------


def linear_w4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    """``x @ w.T + bias`` with w in the w4 format (gemm/w4).

    x: [T, K] float; qweight: uint8 [N, K/2]; scales, mins: float32 [N, K/group_size];
    bias: [N]. Returns [T, N] in x's dtype.
    """
    return impl_for("gemm", "w4", x)(x, qweight, scales, mins, bias, group_size=group_size)


def linear_w8(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    """:func:`linear_w4` for the w8 format (gemm/w8): qweight int8 [N, K]."""
    return impl_for("gemm", "w8", x)(x, qweight, scales, mins, bias, group_size=group_size)


def dequantize_w4(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    """float32 rows of a w4 weight (gemm/w4_dequant): rows int64 [R] (None: all N) -> [R, K].
    Dispatch tensor: ``scales``."""
    return impl_for("gemm", "w4_dequant", scales)(qweight, scales, mins, rows, group_size=group_size)


def dequantize_w8(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    """:func:`dequantize_w4` for the w8 format (gemm/w8_dequant)."""
    return impl_for("gemm", "w8_dequant", scales)(qweight, scales, mins, rows, group_size=group_size)


def linear_quantized(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a :class:`QuantizedWeight` (gemm/w4 or gemm/w8 by its bits)."""
    op = linear_w4 if weight.bits == 4 else linear_w8
    return op(x, weight.qweight, weight.scales, weight.mins, bias, group_size=weight.group_size)


def dequantize(weight: QuantizedWeight, rows: torch.Tensor | None = None) -> torch.Tensor:
    """float32 [R, K]: rows `rows` (int64 [R]; None = all) of a :class:`QuantizedWeight`."""
    op = dequantize_w4 if weight.bits == 4 else dequantize_w8
    return op(weight.qweight, weight.scales, weight.mins, rows, group_size=weight.group_size)


def embedding(ids: torch.Tensor, weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """Rows ``weight[ids]``: ids int64 [T] -> [T, H] in weight's dtype; a QuantizedWeight
    dequantises only the rows looked up."""
    if isinstance(weight, QuantizedWeight):
        return dequantize(weight, ids).to(weight.dtype)
    return torch.nn.functional.embedding(ids, weight)
