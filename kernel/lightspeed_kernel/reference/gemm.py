"""GEMM references: bf16/fp16/fp32 linear through torch; fp8 block-scaled and weight-only w4 / w8 by
dequantise-then-matmul (fp32 math, one rounding to the output dtype)."""

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


# -- weight-only quantised: dequantise (the format's definition), then a float matmul -------------


def _dequantize(codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int) -> torch.Tensor:
    # codes: [R, K] integers; scales, mins: [R, K/g] -> float32 [R, K] = scale * q + min per group
    r, k = codes.shape
    grouped = codes.to(torch.float32).view(r, k // group_size, group_size)
    return (grouped * scales[..., None] + mins[..., None]).view(r, k)


def _w4_codes(qweight: torch.Tensor) -> torch.Tensor:
    # uint8 [R, K/2] -> [R, K] in 0..15: per 32-column block, low nibbles are columns 0-15
    r, half = qweight.shape
    blocks = qweight.view(r, half // 16, 16)
    return torch.stack((blocks & 15, blocks >> 4), dim=2).view(r, half * 2)


def _rows(t: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    if rows is not None and rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= t.shape[0]):
        raise IndexError(f"row index out of range for a weight of {t.shape[0]} rows")
    return t if rows is None else t[rows]


def check_quantized(bits: int, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, group_size: int,
                    x: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> tuple[int, int]:
    """Validate a w4 / w8 weight (and an activation / bias for it); returns (N, K). ValueError if bad."""
    code_dtype, per_byte = (torch.uint8, 2) if bits == 4 else (torch.int8, 1)
    if qweight.dim() != 2 or qweight.dtype != code_dtype:
        raise ValueError(f"w{bits}: qweight must be a 2-D {code_dtype} tensor, got {qweight.dtype} {list(qweight.shape)}")
    n, k = qweight.shape[0], qweight.shape[1] * per_byte
    if k % 32 or group_size < 16 or group_size & (group_size - 1) or k % group_size:
        raise ValueError(f"w{bits}: K={k} must be a multiple of 32 and of group_size={group_size} (a power of two >= 16)")
    for name, tensor in (("scales", scales), ("mins", mins)):
        if tensor.dtype != torch.float32 or tuple(tensor.shape) != (n, k // group_size):
            raise ValueError(f"w{bits}: {name} must be float32 [{n}, {k // group_size}], got {tensor.dtype} "
                             f"{list(tensor.shape)}")
    if x is not None and (x.dim() != 2 or x.shape[1] != k):
        raise ValueError(f"w{bits}: activation {list(x.shape)} for a weight of {k} input features")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"w{bits}: bias {list(bias.shape)} for {n} outputs")
    return n, k


@reference("gemm", "w4_dequant")
def dequantize_w4(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # qweight: uint8 [N, K/2]; scales, mins: [N, K/g]; rows: int64 [R] or None -> float32 [R, K]
    check_quantized(4, qweight, scales, mins, group_size)
    return _dequantize(_w4_codes(_rows(qweight, rows)), _rows(scales, rows), _rows(mins, rows), group_size)


@reference("gemm", "w8_dequant")
def dequantize_w8(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # qweight: int8 [N, K]; scales, mins: [N, K/g]; rows: int64 [R] or None -> float32 [R, K]
    check_quantized(8, qweight, scales, mins, group_size)
    return _dequantize(_rows(qweight, rows), _rows(scales, rows), _rows(mins, rows), group_size)


@reference("gemm", "w4")
def linear_w4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # x: [T, K]; qweight: uint8 [N, K/2]; scales, mins: [N, K/g]; bias: [N] -> [T, N] in x.dtype
    check_quantized(4, qweight, scales, mins, group_size, x, bias)
    w = dequantize_w4(qweight, scales, mins, group_size=group_size)
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


@reference("gemm", "w8")
def linear_w8(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # x: [T, K]; qweight: int8 [N, K]; scales, mins: [N, K/g]; bias: [N] -> [T, N] in x.dtype
    check_quantized(8, qweight, scales, mins, group_size, x, bias)
    w = dequantize_w8(qweight, scales, mins, group_size=group_size)
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)
