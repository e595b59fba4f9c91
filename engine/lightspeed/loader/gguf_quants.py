"""GGUF quantised blocks as Lightspeed's weight-only formats, without dequantising them.

Every GGML block type below is "integer code times a per-group scale, plus a per-group offset",
so it maps exactly onto a `QuantizedWeight` (w[n, k] = scale * q + min per group):

| GGML type | block | its formula | as |
|---|---|---|---|
| Q4_0 | 32 | d (q - 8) | w4, group 32, min -8d (bytes copied as they are) |
| Q4_1 | 32 | d q + m | w4, group 32 (bytes copied as they are) |
| Q4_K | 256 | d sc_j q - dmin m_j (8 sub-blocks of 32) | w4, group 32 |
| Q2_K | 256 | d sc_j q - dmin m_j (16 sub-blocks of 16) | w4, group 16 |
| Q3_K | 256 | d (sc_j - 32) (q - 4) (16 sub-blocks of 16) | w4, group 16 |
| Q5_0 / Q5_1 | 32 | d (q - 16) / d q + m | w8, group 32 |
| Q5_K | 256 | d sc_j q - dmin m_j (8 sub-blocks of 32) | w8, group 32 |
| Q6_K | 256 | d sc_j (q - 32) (16 sub-blocks of 16) | w8, group 16 |
| Q8_0 | 32 | d q | w8, group 32 |

The unpacking mirrors gguf-py's `dequantize_blocks` (the ground truth in the tests); the only
numeric difference is that the kernels apply scale and min with one fused multiply-add.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from lightspeed_kernel import QuantizedWeight

# (codes [blocks, block_size], scales [blocks, groups], mins [blocks, groups]) from raw blocks
Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]

QK_K = 256


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    # [blocks, n, width] bytes -> [blocks, n, 2 * width]: low nibbles first, then high nibbles
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # 12 bytes -> 8 six-bit scales and 8 six-bit mins (gguf-py Q4_K.get_scale_min)
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_0(b: np.ndarray) -> Decoded:
    d = _f16(b[:, :2])
    return _nibbles(b[:, None, 2:], 16)[:, 0], d, -8 * d


def _q4_1(b: np.ndarray) -> Decoded:
    return _nibbles(b[:, None, 4:], 16)[:, 0], _f16(b[:, :2]), _f16(b[:, 2:4])


def _q5_high_bits(qh: np.ndarray) -> np.ndarray:
    return ((qh.view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(b: np.ndarray) -> Decoded:
    d = _f16(b[:, :2])
    q = _nibbles(b[:, None, 6:], 16)[:, 0] | (_q5_high_bits(b[:, 2:6].copy()) << 4)
    return q.astype(np.int16) - 16, d, np.zeros_like(d)


def _q5_1(b: np.ndarray) -> Decoded:
    q = _nibbles(b[:, None, 8:], 16)[:, 0] | (_q5_high_bits(b[:, 4:8].copy()) << 4)
    return q, _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> Decoded:
    d = _f16(b[:, :2])
    return b[:, 2:].view(np.int8), d, np.zeros_like(d)


def _q4_k(b: np.ndarray) -> Decoded:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _nibbles(b[:, 16:].reshape(-1, 4, 32), 32).reshape(-1, QK_K)
    return q, d * sc, -dmin * mn


def _q5_k(b: np.ndarray) -> Decoded:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scale_min(b[:, 4:16])
    qh = b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    low = _nibbles(b[:, 48:].reshape(-1, 4, 32), 32).reshape(-1, 8, 32)
    q = (low | ((qh & 1) << 4)).reshape(-1, QK_K)
    return q, d * sc, -dmin * mn


def _q6_k(b: np.ndarray) -> Decoded:
    ql = _nibbles(b[:, :128].reshape(-1, 2, 64), 64).reshape(-1, 8, 32)
    qh = (b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (ql | (qh.reshape(-1, 8, 32) << 4)).astype(np.int16) - 32
    scales = b[:, 192:208].view(np.int8).astype(np.float32) * _f16(b[:, 208:210])
    return q.reshape(-1, QK_K), scales, np.zeros_like(scales)


def _q2_k(b: np.ndarray) -> Decoded:
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    q = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    return q.reshape(-1, QK_K), d * (scales & 15).astype(np.float32), -dmin * (scales >> 4).astype(np.float32)


def _q3_k(b: np.ndarray) -> Decoded:
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (packed[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(-1, 16)
    high = (packed[:, 8:].reshape(-1, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(-1, 16)
    sc = ((low & 15) | ((high & 3) << 4)).astype(np.float32) - 32
    ql = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    qh = (hmask.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = ql.reshape(-1, QK_K).astype(np.int16) - 4 * (1 - qh.reshape(-1, QK_K).astype(np.int16))  # -4..3
    scale = d * sc
    return q + 4, scale, -4 * scale


# GGML type name -> (bits, group size, block elements, block bytes, decoder)
FORMATS: dict[str, tuple[int, int, int, int, Callable[[np.ndarray], Decoded]]] = {
    "Q4_0": (4, 32, 32, 18, _q4_0),
    "Q4_1": (4, 32, 32, 20, _q4_1),
    "Q4_K": (4, 32, QK_K, 144, _q4_k),
    "Q2_K": (4, 16, QK_K, 84, _q2_k),
    "Q3_K": (4, 16, QK_K, 110, _q3_k),
    "Q5_0": (8, 32, 32, 22, _q5_0),
    "Q5_1": (8, 32, 32, 24, _q5_1),
    "Q5_K": (8, 32, QK_K, 176, _q5_k),
    "Q6_K": (8, 16, QK_K, 210, _q6_k),
    "Q8_0": (8, 32, 32, 34, _q8_0),
}


def native_format(type_name: str) -> tuple[int, int] | None:
    """(bits, group_size) that holds a GGML type exactly, or None (float or unsupported types)."""
    entry = FORMATS.get(type_name)
    return None if entry is None else entry[:2]


def decode_blocks(type_name: str, raw: np.ndarray, rows: int, cols: int) -> QuantizedWeight:
    """A [rows, cols] QuantizedWeight from the raw bytes of a GGUF tensor of type `type_name`."""
    bits, group, block, nbytes, decode = FORMATS[type_name]
    if cols % block:
        raise ValueError(f"{type_name} tensor with {cols} columns is not a whole number of {block}-blocks")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1, nbytes)
    if blocks.shape[0] != rows * cols // block:
        raise ValueError(f"{type_name} tensor: {blocks.shape[0]} blocks for a [{rows}, {cols}] weight")
    codes, scales, mins = decode(blocks)
    groups = cols // group
    return QuantizedWeight.from_codes(
        torch.from_numpy(np.ascontiguousarray(codes).reshape(rows, cols).astype(np.int16)),
        torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32).reshape(rows, groups)),
        torch.from_numpy(np.ascontiguousarray(mins, dtype=np.float32).reshape(rows, groups)), bits, group)
