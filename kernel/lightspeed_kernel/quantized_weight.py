"""Weight-only quantised matrices: the w4 / w8 formats that the gemm/w4 and gemm/w8 ops read.

For output row n and input column k, with group g = k // group_size::

    w[n, k] = scales[n, g] * q[n, k] + mins[n, g]

- ``bits=4``: q in 0..15, ``qweight`` uint8 [N, K/2], two codes per byte. In each 32-column
  block, byte j holds column j in its low nibble and column j + 16 in its high one: GGUF's
  Q4_0 / Q4_1 block order, so those blocks copy in unchanged.
- ``bits=8``: q in -128..127, ``qweight`` int8 [N, K].
- ``scales``, ``mins``: float32 [N, K / group_size]; ``group_size`` a power of two >= 16 that
  divides K; K a multiple of 32.

A `QuantizedWeight` behaves enough like a weight tensor for parameter loaders written for float
weights: ``shape`` is the logical [N, K], ``narrow`` along rows (or along whole groups of
columns) is a view of the same storage, and ``copy_`` fills it from a float tensor (quantised
here) or from another QuantizedWeight (copied exactly when its codes fit, else requantised).
Every ``copy_`` appends a `CopyRecord` to ``copy_log`` (shared by the views of one storage), so
a loader can report which weights were requantised and how far they moved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32  # columns per nibble block (w4) and the alignment of K


@dataclass(frozen=True)
class CopyRecord:
    """One `QuantizedWeight.copy_`: rows [row_start, row_start + rows) of the destination."""

    row_start: int
    rows: int
    exact: bool
    """True when the stored weights equal the source's exactly (up to float rounding of scales)."""
    rel_error: float
    """||w_stored - w_source|| / ||w_source|| (0 when exact)."""
    source: str
    """"float", or "w4/g32" style for a quantised source."""


def _check_format(bits: int, group_size: int, in_features: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"quantised weights have 4 or 8 bits, got {bits}")
    if group_size < 16 or group_size & (group_size - 1):
        raise ValueError(f"group_size must be a power of two >= 16, got {group_size}")
    if in_features % BLOCK or in_features % group_size:
        raise ValueError(f"in_features={in_features} must be a multiple of {BLOCK} and of group_size={group_size}")


def pack_w4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in 0..15 -> qweight uint8 [N, K/2] in the w4 block order."""
    n, k = codes.shape
    blocks = codes.to(torch.uint8).reshape(n, k // BLOCK, 2, BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_w4(qweight: torch.Tensor) -> torch.Tensor:
    """qweight uint8 [N, K/2] -> codes uint8 [N, K] in 0..15."""
    n, half = qweight.shape
    blocks = qweight.reshape(n, half // (BLOCK // 2), BLOCK // 2)
    return torch.stack((blocks & 15, blocks >> 4), dim=2).reshape(n, half * 2)


class QuantizedWeight:
    """A weight-only quantised [N, K] matrix (see the module docstring for the format). Like an
    nn.Parameter it takes extra attributes (an engine's ``weight_loader``, say)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, bits: int,
                 group_size: int, *, dtype: torch.dtype = torch.float32, copy_log: list[CopyRecord] | None = None,
                 row_offset: int = 0):
        n = qweight.shape[0]
        k = qweight.shape[1] * (2 if bits == 4 else 1)
        _check_format(bits, group_size, k)
        want = torch.uint8 if bits == 4 else torch.int8
        if qweight.dtype != want or qweight.dim() != 2:
            raise ValueError(f"w{bits} qweight must be a 2-D {want} tensor, got {qweight.dtype} {list(qweight.shape)}")
        groups = (n, k // group_size)
        for name, t in (("scales", scales), ("mins", mins)):
            if t.dtype != torch.float32 or tuple(t.shape) != groups:
                raise ValueError(f"{name} must be float32 {list(groups)}, got {t.dtype} {list(t.shape)}")
        self.qweight, self.scales, self.mins = qweight, scales, mins
        self.bits, self.group_size = bits, group_size
        self.dtype = dtype  # the float dtype this weight stands in for: dequantize() and lookups give it
        self.copy_log = [] if copy_log is None else copy_log
        self._row_offset = row_offset

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def empty(cls, out_features: int, in_features: int, bits: int, group_size: int = 32,
              device: torch.device | str | None = None, dtype: torch.dtype = torch.float32) -> QuantizedWeight:
        """Uninitialised storage (zero scales) for an [out_features, in_features] weight."""
        _check_format(bits, group_size, in_features)
        cols = in_features // 2 if bits == 4 else in_features
        groups = (out_features, in_features // group_size)
        return cls(torch.zeros(out_features, cols, dtype=torch.uint8 if bits == 4 else torch.int8, device=device),
                   torch.zeros(groups, dtype=torch.float32, device=device),
                   torch.zeros(groups, dtype=torch.float32, device=device), bits, group_size, dtype=dtype)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None, bits: int,
                   group_size: int) -> QuantizedWeight:
        """From unpacked integer codes [N, K] (0..15 for 4 bits, -128..127 for 8) and per-group
        scales / mins [N, K / group_size] (mins None: 0)."""
        scales = scales.to(torch.float32).contiguous()
        mins = torch.zeros_like(scales) if mins is None else mins.to(torch.float32).contiguous()
        lo, hi = (0, 15) if bits == 4 else (-128, 127)
        if codes.numel() and (int(codes.min()) < lo or int(codes.max()) > hi):
            raise ValueError(f"{bits}-bit codes must lie in {lo}..{hi}")
        qweight = pack_w4(codes) if bits == 4 else codes.to(torch.int8).contiguous()
        return cls(qweight.contiguous(), scales, mins, bits, group_size)

    @classmethod
    def quantize(cls, weight: torch.Tensor, bits: int, group_size: int = 32) -> QuantizedWeight:
        """Quantise a float [N, K] matrix per group: 4 bits asymmetric (scale = (max - min) / 15,
        min = the group minimum, as GGUF's Q4_1), 8 bits symmetric (scale = max |w| / 127, as Q8_0)."""
        n, k = weight.shape
        _check_format(bits, group_size, k)
        w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
        if bits == 4:
            low, high = w.amin(dim=-1), w.amax(dim=-1)
            scales = (high - low) / 15
            safe = torch.where(scales > 0, scales, torch.ones_like(scales))
            codes = torch.round((w - low[..., None]) / safe[..., None]).clamp_(0, 15)
            mins = low
        else:
            scales = w.abs().amax(dim=-1) / 127
            safe = torch.where(scales > 0, scales, torch.ones_like(scales))
            codes = torch.round(w / safe[..., None]).clamp_(-127, 127)
            mins = torch.zeros_like(scales)
        return cls.from_codes(codes.reshape(n, k).to(torch.int16), scales, mins, bits, group_size)

    # -- tensor-like view --------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.qweight.shape[0], self.scales.shape[1] * self.group_size))

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def data(self) -> QuantizedWeight:
        return self  # loaders written for nn.Parameter reach the storage through .data

    @property
    def format(self) -> str:
        return f"w{self.bits}/g{self.group_size}"

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.mins))

    def dim(self) -> int:
        return 2

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def codes(self) -> torch.Tensor:
        """Unpacked codes [N, K]: uint8 0..15 (4 bits) or int8 (8 bits)."""
        return unpack_w4(self.qweight) if self.bits == 4 else self.qweight

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The float matrix [N, K] in `dtype` (default: self.dtype), via the gemm/w{bits}_dequant op."""
        from .ops.gemm import dequantize

        return dequantize(self).to(dtype or self.dtype)

    def narrow(self, dim: int, start: int, length: int) -> QuantizedWeight:
        """A view of rows [start, start + length) (dim 0) or of whole groups of columns (dim 1)."""
        if dim == 0:
            return QuantizedWeight(self.qweight.narrow(0, start, length), self.scales.narrow(0, start, length),
                                   self.mins.narrow(0, start, length), self.bits, self.group_size, dtype=self.dtype,
                                   copy_log=self.copy_log, row_offset=self._row_offset + start)
        if dim not in (1, -1):
            raise IndexError(f"QuantizedWeight has 2 dims, got dim={dim}")
        align = max(BLOCK, self.group_size)
        if start % align or length % align:
            raise ValueError(f"column slices of a {self.format} weight must be multiples of {align}, "
                             f"got [{start}, {start + length})")
        per_byte = 2 if self.bits == 4 else 1
        g = self.group_size
        return QuantizedWeight(self.qweight.narrow(1, start // per_byte, length // per_byte),
                               self.scales.narrow(1, start // g, length // g), self.mins.narrow(1, start // g, length // g),
                               self.bits, g, dtype=self.dtype, copy_log=self.copy_log, row_offset=self._row_offset)

    def index_rows(self, index: torch.Tensor) -> QuantizedWeight:
        """A new weight holding rows `index` (e.g. llama.cpp's q/k row permutation undone)."""
        return QuantizedWeight(self.qweight[index], self.scales[index], self.mins[index], self.bits, self.group_size,
                               dtype=self.dtype)

    def __repr__(self) -> str:
        n, k = self.shape
        return f"QuantizedWeight({self.format}, [{n}, {k}], {self.nbytes / 2**20:.1f} MiB, {self.device})"

    # -- filling -----------------------------------------------------------------------------
    def zero_(self) -> QuantizedWeight:
        """All weights 0 (e.g. the padding rows of a vocabulary-parallel embedding)."""
        for t in (self.qweight, self.scales, self.mins):
            t.zero_()
        return self

    def copy_(self, source: torch.Tensor | QuantizedWeight) -> QuantizedWeight:
        """Fill from `source` of the same logical shape: a QuantizedWeight whose codes fit this
        format (no more bits, a group size that is a multiple of ours) is copied exactly; anything
        else is quantised into this format and the error is recorded in `copy_log`."""
        if tuple(source.shape) != tuple(self.shape):
            raise ValueError(f"cannot copy a {list(source.shape)} weight into a {list(self.shape)} one")
        if isinstance(source, QuantizedWeight) and self._fits(source):
            self._copy_exact(source)
            self._log(True, 0.0, source.format)
            return self
        dense = source.dequantize(torch.float32) if isinstance(source, QuantizedWeight) else source.to(torch.float32)
        if not torch.isfinite(dense).all():
            raise ValueError("weight holds non-finite values; cannot quantise it")
        stored = QuantizedWeight.quantize(dense.to(self.device), self.bits, self.group_size)
        self._copy_exact(stored)
        norm = float(dense.norm())
        error = float((stored.dequantize(torch.float32) - dense.to(self.device)).norm()) / norm if norm > 0 else 0.0
        self._log(False, error, source.format if isinstance(source, QuantizedWeight) else "float")
        return self

    def _fits(self, source: QuantizedWeight) -> bool:
        return source.bits <= self.bits and source.group_size % self.group_size == 0

    def _copy_exact(self, source: QuantizedWeight) -> None:
        repeat = source.group_size // self.group_size
        if source.bits == self.bits:
            self.qweight.copy_(source.qweight)
        else:  # 4-bit codes widened to int8: the same values, scales and mins unchanged
            self.qweight.copy_(unpack_w4(source.qweight).to(torch.int8))
        self.scales.copy_(source.scales.repeat_interleave(repeat, dim=1))
        self.mins.copy_(source.mins.repeat_interleave(repeat, dim=1))

    def _log(self, exact: bool, error: float, source: str) -> None:
        self.copy_log.append(CopyRecord(self._row_offset, self.shape[0], exact, error, source))
