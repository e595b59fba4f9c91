"""Native fp32 CPU kernels of the small per-token ops (csrc/elementwise.c): RMSNorm (+ residual),
SiLU-and-mul, rotary embedding, paged K/V store. Inputs they do not cover (another dtype, a
layout the C code does not take, scaled fp8 caches) go to the torch reference."""

from __future__ import annotations

import torch

from ..reference import activation as ref_activation
from ..reference import kv_store as ref_kv_store
from ..reference import norm as ref_norm
from ..reference import rope as ref_rope
from ..registry import Priority, register_kernel
from . import native

F32 = (torch.float32,)


def _native(family: str, mode: str):
    return register_kernel(family, mode, name=f"native_{mode}", solution="native", priority=Priority.PERFORMANT,
                           capability="cpu", dtypes=F32)


def _rows(t: torch.Tensor) -> bool:
    """2-D with contiguous rows (any row stride)."""
    return t.dim() == 2 and t.stride(-1) == 1 and t.dtype == torch.float32


def _heads(t: torch.Tensor) -> bool:
    """[T, H, D] with contiguous heads laid out one after another in each token row."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2] and t.dtype == torch.float32


@_native("norm", "rms")
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None) -> torch.Tensor:
    # x: [T, H]; weight: [H] -> [T, H]
    target = out if out is None or _rows(out) else None
    if not (_rows(x) and weight.dtype == torch.float32 and weight.is_contiguous() and (out is None or target is not None)):
        return ref_norm.rms_norm(x, weight, eps, out=out)
    result = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    t, h = x.shape
    native.call("ls_rms_norm", x.data_ptr(), t, h, x.stride(0), weight.data_ptr(), eps, result.data_ptr(),
                          result.stride(0))
    return result


@_native("norm", "fused_add_rms")
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    # x, residual: [T, H] (new residual written into `residual`, as the reference does)
    if not (x.is_contiguous() and residual.is_contiguous() and x.dtype == residual.dtype == weight.dtype == torch.float32
            and weight.is_contiguous() and x.dim() == 2 and x.shape == residual.shape):
        return ref_norm.fused_add_rms_norm(x, residual, weight, eps)
    out = torch.empty_like(x)
    t, h = x.shape
    native.call("ls_fused_add_rms_norm", x.data_ptr(), residual.data_ptr(), t, h, weight.data_ptr(), eps,
                out.data_ptr())
    return out, residual


@_native("activation", "silu_and_mul")
def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    # x: [T, 2I] -> [T, I]
    if not (_rows(x) and (out is None or _rows(out))):
        return ref_activation.silu_and_mul(x, out=out)
    t, half = x.shape[0], x.shape[1] // 2
    result = torch.empty(t, half, dtype=torch.float32) if out is None else out
    native.call("ls_silu_and_mul", x.data_ptr(), t, half, x.stride(0), result.data_ptr(), result.stride(0))
    return result


@_native("rope", "rotary")
def apply_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, *,
               is_neox: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: int64 [T]; q: [T, Hq, D], k: [T, Hkv, D] rotated in place; cache [max_pos, rot_dim] fp32
    if not (_heads(q) and _heads(k) and q.shape[2] == k.shape[2] and cos_sin_cache.dtype == torch.float32
            and cos_sin_cache.is_contiguous() and positions.dtype == torch.int64 and positions.is_contiguous()):
        return ref_rope.apply_rope(positions, q, k, cos_sin_cache, is_neox=is_neox)
    max_position, rot_dim = cos_sin_cache.shape
    rc = native.call("ls_rope", positions.data_ptr(), q.shape[0], q.data_ptr(), q.shape[1], q.stride(0), k.data_ptr(),
                           k.shape[1], k.stride(0), q.shape[2], cos_sin_cache.data_ptr(), max_position, rot_dim,
                           int(is_neox))
    if rc:
        raise IndexError(f"rope: a position is outside the cos/sin cache of {max_position} positions")
    return q, k


@register_kernel("kv_store", "paged", name="native_paged", solution="native", priority=Priority.PERFORMANT,
                 capability="cpu", dtypes=F32)
def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, *, k_scale: torch.Tensor | float | None = None,
             v_scale: torch.Tensor | float | None = None) -> None:
    # k, v: [T, Hkv, D]; caches [num_pages, page_size, Hkv, D]; slot_mapping int64 [T], -1 = skip
    plain = (k_scale is None and v_scale is None and _heads(k) and _heads(v) and k_cache.dtype == v_cache.dtype
             == torch.float32 and k_cache.is_contiguous() and v_cache.is_contiguous()
             and slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous())
    if not plain:
        return ref_kv_store.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    row = k.shape[1] * k.shape[2]
    if k_cache.shape[2] * k_cache.shape[3] != row or v.shape != k.shape:
        raise ValueError(f"store_kv: k {list(k.shape)}, v {list(v.shape)} vs cache {list(k_cache.shape)}")
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    rc = native.call("ls_store_kv", k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k.shape[0], row,
                               k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), num_slots)
    if rc:
        raise IndexError(f"store_kv: a slot is outside the cache's {num_slots} slots")
