"""Native weight-only quantised GEMM on the CPU (gemm/w4, gemm/w8 and their dequantisation).

By token rows T (the crossovers measured on a 2-core AMD EPYC, AVX2: bench/results/kernels_cpu_*.md):
- T = 1 (a single decode stream): the fused C kernel with fp32 activations (quant_gemm.c), bound
  by streaming the weights in, so int8 activations would cost precision and win nothing;
- 2 <= T < DENSE_MIN_ROWS (decode batches): the same fused kernel, its weight-block expansion
  shared by up to 8 token rows; from PANEL_MIN_ROWS its panel path (two weight rows dequantised
  to an L1 scratch, then a register-blocked 2 x 6 micro-kernel over every token row): 1.2-1.4x
  the row tiles at 16-23 rows, about even at 9-10 (bench/results/kernels_cpu_t1_2026-12-01_125905
  and _125939_x86-64.md). With LIGHTSPEED_KERNEL_Q8_ACTIVATIONS=1, 4-bit weights instead
  quantise activations to int8 (one scale per 256 columns) and run integer dots (q8_gemm.c): on a
  Zen 3 without VNNI a maddubs + madd pair costs about what the four fp32 FMAs it replaces do, so
  it measured 1.0-1.5x the fp32 kernel at 2 rows and 0.6-1.0x at 16
  (bench/results/kernels_cpu_t1_2026-12-01_123216_x86-64.md), hence off by default. 8-bit weights always
  keep fp32 activations: their sign trick costs one more integer op per block;
- T >= DENSE_MIN_ROWS (prompts): the weight dequantised a chunk of rows at a time and multiplied
  by torch's GEMM (MKL / oneDNN), which wins once the dequantisation is shared by enough rows;
  from WHOLE_WEIGHT_ROWS the whole weight at once, one GEMM call (4.7% off a 2048-token prefill:
  bench/results/prefill_whole_weight_cpu_t1_*.md).
"""

from __future__ import annotations

import torch

from ..env import kernel_env
from ..reference.gemm import check_quantized
from ..registry import Priority, register_kernel
from . import native

DENSE_MIN_ROWS = 32  # the panel path beat dequantise + GEMM on every shape at 24 rows, not at 32 (_125939)
PANEL_MIN_ROWS = 9  # fused kernel: from here its panel path (quant_gemm.c; 8 rows share one tile before it)
Q8_MIN_ROWS = 2
Q8_BITS = (4,)  # weight widths whose multi-row GEMMs quantise activations (the module docstring says why)
CHUNK_ELEMENTS = 1 << 20  # fp32 weights dequantised at once on the dense path: 4 MiB, cache-resident
# From this many token rows (a prompt), the GEMM is long enough that a cache-resident chunk saves
# nothing: the whole weight (up to 32 MiB fp32) is dequantised once and multiplied in one GEMM call,
# which blocks better than one call per chunk.
WHOLE_WEIGHT_ROWS = 256
WHOLE_WEIGHT_ELEMENTS = 1 << 23
ACTIVATION_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(bits: int, x: torch.Tensor | None, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
           bias: torch.Tensor | None, group_size: int) -> tuple[int, int]:
    n, k = check_quantized(bits, qweight, scales, mins, group_size, x, bias)
    if not (qweight.is_contiguous() and scales.is_contiguous() and mins.is_contiguous()):
        raise ValueError(f"w{bits}: the native kernels need contiguous qweight, scales and mins")
    return n, k


# Attribute of a scales tensor holding (its _version when made, kw int16 [N, 2 K/32], dw fp32
# [N, ceil(K/256)]): the integer form of a weight's scales for the int8-activation kernel, made at
# its first multi-row call and again only if the scales change in place (a weight load). Kept on
# the tensor itself, so it lives exactly as long as the weight (recorded graphs hold its pointers).
_Q8_ATTR = "_lightspeed_q8_scales"


def q8_scales(bits: int, scales: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (kw, dw) integer scales of `scales` for ls_w*_linear_q8 (cached on the tensor)."""
    cached = getattr(scales, _Q8_ATTR, None)
    if cached is not None and cached[0] == (scales._version, bits, group_size):
        return cached[1], cached[2]
    n, k = scales.shape[0], scales.shape[1] * group_size
    kw = torch.empty(n, 2 * (k // 32), dtype=torch.int16)
    dw = torch.empty(n, -(-k // 256), dtype=torch.float32)
    # called directly, not through native.call: a graph being recorded must not replay this per step
    if native.library().ls_q8_weight_scales(scales.data_ptr(), n, k, group_size, bits, kw.data_ptr(), dw.data_ptr()):
        raise ValueError(f"w{bits} int8-activation scales: unsupported shape (K={k}, group_size={group_size})")
    setattr(scales, _Q8_ATTR, ((scales._version, bits, group_size), kw, dw))
    return kw, dw


def linear_q8_into(bits: int, xf: torch.Tensor, qweight, scales, mins, bias_f: torch.Tensor | None,
                   group_size: int, out: torch.Tensor, force_scalar: bool = False) -> int:
    """out[T, N] = xf @ w.T (+ bias_f) through the int8-activation kernel (fp32 contiguous xf,
    bias_f, out; shapes checked by the caller); force_scalar runs the portable loops. Returns the
    kernel's status."""
    kw, dw = q8_scales(bits, scales, group_size)
    t, k = xf.shape
    return native.call(f"ls_w{bits}_linear_q8", xf.data_ptr(), t, k, qweight.data_ptr(), kw.data_ptr(), dw.data_ptr(),
                       mins.data_ptr(), qweight.shape[0], group_size, None if bias_f is None else bias_f.data_ptr(),
                       out.data_ptr(), int(force_scalar))


def _dequant_rows(bits: int, qweight, scales, mins, group_size: int, first: int, count: int, out: torch.Tensor,
                  rows: torch.Tensor | None = None) -> None:
    """Rows [first, first + count) (or `rows`) of the weight into `out` [count, K] fp32."""
    k = scales.shape[1] * group_size
    row_bytes = k * bits // 8
    gpr_bytes = scales.shape[1] * 4
    rc = native.call("ls_w4_dequant" if bits == 4 else "ls_w8_dequant", qweight.data_ptr() + first * row_bytes,
                     scales.data_ptr() + first * gpr_bytes,
            mins.data_ptr() + first * gpr_bytes, k, group_size, None if rows is None else rows.data_ptr(),
            count, out.data_ptr())
    if rc:
        raise ValueError(f"w{bits} dequantise: unsupported shape (K={k}, group_size={group_size})")


def _linear(bits: int, x, qweight, scales, mins, bias, group_size: int) -> torch.Tensor:
    n, k = _check(bits, x, qweight, scales, mins, bias, group_size)
    t = x.shape[0]
    # decode calls are ~50 us: skip even no-op conversions (~1 us each) when nothing is to convert
    xf = x if x.dtype == torch.float32 and x.is_contiguous() else x.to(torch.float32).contiguous()
    bias_f = None if bias is None else bias.to(torch.float32).contiguous()
    out = torch.empty(t, n, dtype=torch.float32)
    if t == 0 or n == 0:
        return out.to(x.dtype)
    if t < DENSE_MIN_ROWS:
        env = kernel_env()
        if t >= Q8_MIN_ROWS and bits in Q8_BITS and env.q8_activations:
            rc = linear_q8_into(bits, xf, qweight, scales, mins, bias_f, group_size, out, env.native_scalar)
        else:
            rc = native.call(f"ls_w{bits}_linear", xf.data_ptr(), t, k, qweight.data_ptr(), scales.data_ptr(),
                             mins.data_ptr(), n, group_size, None if bias_f is None else bias_f.data_ptr(),
                             out.data_ptr(), PANEL_MIN_ROWS)
        if rc:
            raise RuntimeError(f"w{bits} linear kernel failed (code {rc})")
    else:
        whole = t >= WHOLE_WEIGHT_ROWS and n * k <= WHOLE_WEIGHT_ELEMENTS
        rows = n if whole else max(1, min(n, CHUNK_ELEMENTS // k))
        weight = torch.empty(rows, k, dtype=torch.float32)
        for first in range(0, n, rows):
            count = min(rows, n - first)
            _dequant_rows(bits, qweight, scales, mins, group_size, first, count, weight)
            # A column slice of `out` (row stride n) is a valid GEMM output: written in place,
            # with no temporary product and no strided copy.
            torch.mm(xf, weight[:count].t(), out=out[:, first:first + count])
        if bias_f is not None:
            out += bias_f
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def _native(mode: str, dtypes=ACTIVATION_DTYPES):
    return register_kernel("gemm", mode, name=f"native_{mode}", solution="native", priority=Priority.PERFORMANT,
                           capability="cpu", dtypes=dtypes)


@_native("w4")
def linear_w4(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # x: [T, K] (fp32 math; bf16 / fp16 converted); qweight uint8 [N, K/2]; scales, mins [N, K/g] -> [T, N]
    return _linear(4, x, qweight, scales, mins, bias, group_size)


@_native("w8")
def linear_w8(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # x: [T, K]; qweight int8 [N, K]; scales, mins [N, K/g] -> [T, N]
    return _linear(8, x, qweight, scales, mins, bias, group_size)


def _dequantize(bits: int, qweight, scales, mins, rows, group_size: int) -> torch.Tensor:
    _, k = _check(bits, None, qweight, scales, mins, None, group_size)
    if rows is not None:
        rows = rows.to(torch.int64).contiguous()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= qweight.shape[0]):
            raise IndexError(f"row index out of range for a weight of {qweight.shape[0]} rows")
    count = qweight.shape[0] if rows is None else rows.numel()
    out = torch.empty(count, k, dtype=torch.float32)
    if count:
        _dequant_rows(bits, qweight, scales, mins, group_size, 0, count, out, rows)
    return out


@_native("w4_dequant", dtypes=(torch.float32,))
def dequantize_w4(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # qweight uint8 [N, K/2]; scales, mins [N, K/g]; rows int64 [R] or None -> fp32 [R, K]
    return _dequantize(4, qweight, scales, mins, rows, group_size)


@_native("w8_dequant", dtypes=(torch.float32,))
def dequantize_w8(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    group_size: int,
) -> torch.Tensor:
    # qweight int8 [N, K]; scales, mins [N, K/g]; rows int64 [R] or None -> fp32 [R, K]
    return _dequantize(8, qweight, scales, mins, rows, group_size)
