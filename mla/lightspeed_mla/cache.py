"""Paged MLA cache formats and the `pack_kv` store op.

The absorbed form keeps one shared "head" per token: the 512-wide compressed latent (it is both the
key's no-rope part and the value) plus the 64-wide rope key, 576 values a token.

Two formats, one view for the kernels:

* ``bf16``: one packed tensor ``[pages, page_size, 576]``; ``latent`` and ``rope`` are views of it.
* ``fp8``: latent in e4m3 ``[pages, page_size, 512]`` with one fp32 scale per token
  ``[pages, page_size, 1]`` (latent = e4m3 * scale), rope in bf16 ``[pages, page_size, 64]``.
  644 bytes a token instead of 1152: the rope part stays bf16 because position information is
  what e4m3's 3-bit mantissa loses first, and it is only 1/9 of the row.

Kernels read ``latent``, ``rope`` and ``scale`` (None for bf16) through their strides, so one
kernel body serves both formats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton import HAS_TRITON, interpreting, require_triton

D_LATENT = 512
D_ROPE = 64
D_PACKED = D_LATENT + D_ROPE
FP8_MAX = 448.0  # largest finite float8_e4m3fn
CACHE_KINDS = ("bf16", "fp8")


@dataclass(frozen=True)
class MLACache:
    """A paged MLA KV cache (one layer).

    kind:   "bf16" or "fp8".
    latent: [pages, page_size, 512], bf16 (a view of ``packed``) or float8_e4m3fn.
    rope:   [pages, page_size, 64] bf16 (a view of ``packed`` for bf16).
    scale:  [pages, page_size, 1] fp32 for fp8, else None.
    packed: [pages, page_size, 576] bf16 for bf16, else None.
    """

    kind: str
    latent: torch.Tensor
    rope: torch.Tensor
    scale: torch.Tensor | None = None
    packed: torch.Tensor | None = None

    def __post_init__(self):
        if self.kind not in CACHE_KINDS:
            raise ValueError(f"MLACache.kind must be one of {CACHE_KINDS}, got {self.kind!r}")
        if self.latent.shape[-1] != D_LATENT or self.rope.shape[-1] != D_ROPE:
            raise ValueError("MLACache: latent must end in 512 and rope in 64")
        if self.latent.shape[:2] != self.rope.shape[:2]:
            raise ValueError("MLACache: latent and rope disagree on [pages, page_size]")
        if self.kind == "fp8" and (self.scale is None or self.latent.dtype != torch.float8_e4m3fn):
            raise ValueError("MLACache fp8: latent must be float8_e4m3fn and scale given")

    @property
    def num_pages(self) -> int:
        return self.latent.shape[0]

    @property
    def page_size(self) -> int:
        return self.latent.shape[1]

    @property
    def bytes_per_token(self) -> int:
        """HBM bytes a kernel reads per cached token."""
        return D_PACKED * 2 if self.kind == "bf16" else D_LATENT + 4 + D_ROPE * 2

    @classmethod
    def from_packed(cls, packed: torch.Tensor) -> MLACache:
        """Wrap a bf16 ``[pages, page_size, 576]`` tensor."""
        if packed.dim() != 3 or packed.shape[-1] != D_PACKED or packed.dtype != torch.bfloat16:
            raise ValueError(f"packed cache must be bf16 [pages, page_size, {D_PACKED}]")
        return cls("bf16", packed[..., :D_LATENT], packed[..., D_LATENT:], None, packed)

    @classmethod
    def empty(cls, num_pages: int, page_size: int, kind: str = "bf16", device="cpu") -> MLACache:
        """Allocate an (uninitialised) cache of ``num_pages`` pages of ``page_size`` tokens."""
        if kind == "bf16":
            return cls.from_packed(torch.empty(num_pages, page_size, D_PACKED, dtype=torch.bfloat16, device=device))
        if kind == "fp8":
            return cls(
                "fp8",
                torch.empty(num_pages, page_size, D_LATENT, dtype=torch.float8_e4m3fn, device=device),
                torch.empty(num_pages, page_size, D_ROPE, dtype=torch.bfloat16, device=device),
                torch.empty(num_pages, page_size, 1, dtype=torch.float32, device=device),
            )
        raise ValueError(f"cache kind must be one of {CACHE_KINDS}, got {kind!r}")

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(latent, rope) in float32, [pages, page_size, 512] and [pages, page_size, 64]."""
        latent = self.latent.float()
        if self.scale is not None:
            latent = latent * self.scale
        return latent, self.rope.float()


def quantize_latent_fp8(latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token e4m3 quantisation. latent: [T, 512] -> (e4m3 [T, 512], fp32 scale [T, 1])."""
    amax = latent.float().abs().amax(dim=-1, keepdim=True).clamp_min(1e-12)
    scale = amax / FP8_MAX
    return (latent.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def pack_kv_reference(latent: torch.Tensor, rope: torch.Tensor, slot_mapping: torch.Tensor, cache: MLACache) -> None:
    """Torch reference of :func:`pack_kv` (slots < 0 are skipped). Also stores into an unquantised
    ("bf16" kind) cache of another float dtype, e.g. fp32 for exact CPU tests."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    pages, offsets = slots // cache.page_size, slots % cache.page_size
    lat, rp = latent[keep], rope[keep]
    if cache.kind == "bf16":
        # The unquantised layout in the cache's own dtype: bf16 on GPUs, fp32 in CPU parity tests.
        cache.latent[pages, offsets] = lat.to(cache.latent.dtype)
    else:
        q, s = quantize_latent_fp8(lat)
        cache.latent[pages, offsets] = q
        cache.scale[pages, offsets] = s
    cache.rope[pages, offsets] = rp.to(cache.rope.dtype)


if HAS_TRITON:
    from ._triton import tl, triton

    @triton.jit
    def _pack_kv_kernel(
        Latent, Rope, Slots, CLat, CRope, CScale,
        stride_lt, stride_rt, stride_clat_tok, stride_crope_tok,
        IS_FP8: tl.constexpr,
        ROUND_TO_E4M3: tl.constexpr,
    ):
        # One program per new token: 576 values, so the launch is bound by the token count.
        tok = tl.program_id(0)
        slot = tl.load(Slots + tok).to(tl.int64)
        if slot >= 0:
            d = tl.arange(0, 512)
            r = tl.arange(0, 64)
            lat = tl.load(Latent + tok * stride_lt + d).to(tl.float32)
            rope = tl.load(Rope + tok * stride_rt + r)
            if IS_FP8:
                amax = tl.maximum(tl.max(tl.abs(lat), axis=0), 1e-12)
                scale = amax / 448.0
                q = tl.clamp(lat / scale, -448.0, 448.0)
                if ROUND_TO_E4M3:
                    # Snap to the e4m3 grid first (3 mantissa bits; subnormal step 2^-9), so the
                    # cast is exact: Triton 3.9's interpreter drops the carry when rounding up.
                    mag = tl.abs(q)
                    e = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1.0 / 512.0))), -6.0)
                    step = tl.exp2(e - 3.0)
                    q = tl.where(q < 0, -1.0, 1.0) * tl.floor(mag / step + 0.5) * step
                tl.store(CLat + slot * stride_clat_tok + d, q.to(CLat.dtype.element_ty))
                tl.store(CScale + slot, scale)
            else:
                tl.store(CLat + slot * stride_clat_tok + d, lat.to(tl.bfloat16))
            tl.store(CRope + slot * stride_crope_tok + r, rope.to(tl.bfloat16))


def pack_kv(latent: torch.Tensor, rope: torch.Tensor, slot_mapping: torch.Tensor, cache: MLACache) -> None:
    """Store new tokens' latent and rope key into the paged cache (in place).

    latent: [T, 512] (any float dtype); rope: [T, 64]; slot_mapping: [T] int (page * page_size +
    offset; negative = padding, skipped). fp8 caches quantise the latent per token (amax / 448).
    """
    require_triton()
    T = latent.shape[0]
    if latent.shape != (T, D_LATENT) or rope.shape != (T, D_ROPE) or slot_mapping.shape != (T,):
        raise ValueError(f"pack_kv: want latent [T,512], rope [T,64], slot_mapping [T]; got "
                         f"{tuple(latent.shape)}, {tuple(rope.shape)}, {tuple(slot_mapping.shape)}")
    if latent.stride(-1) != 1 or rope.stride(-1) != 1:
        raise ValueError("pack_kv: latent and rope must be contiguous in the last dim")
    # The cache rows are addressed as slot * token_stride: [pages, page_size] must be one flat axis.
    for t in (cache.latent, cache.rope):
        if t.stride(0) != t.shape[1] * t.stride(1) or t.stride(-1) != 1:
            raise ValueError("pack_kv: cache tensors must be flat over [pages, page_size]")
    if T == 0:
        return
    is_fp8 = cache.kind == "fp8"
    _pack_kv_kernel[(T,)](
        latent, rope, slot_mapping, cache.latent, cache.rope,
        cache.scale if is_fp8 else cache.rope,
        latent.stride(0), rope.stride(0), cache.latent.stride(1), cache.rope.stride(1),
        IS_FP8=is_fp8, ROUND_TO_E4M3=is_fp8 and interpreting(),
    )
