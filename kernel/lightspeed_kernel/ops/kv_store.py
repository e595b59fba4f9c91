"""Paged KV write ops (family ``kv_store``): the plain store, and the store fused with the rotary
embedding of q and k. Dispatch dtype: ``k.dtype``; both request feature ``fp8_kv`` when the cache is fp8."""

from __future__ import annotations

import torch

from ._dispatch import FP8_DTYPES, FP8_KV, impl_for


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> None:
    """Write K/V of new tokens into the paged cache, in place (kv_store/paged).

    k, v: [T, Hkv, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D]; slot_mapping: [T] int64
    = page * page_size + offset, -1 = skip. fp8 caches store ``k / k_scale`` (scales: fp32 scalars).
    """
    features = (FP8_KV,) if k_cache.dtype in FP8_DTYPES else ()
    impl_for("kv_store", "paged", k, features)(
        k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale
    )


def rope_store_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    is_neox: bool = True,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """``apply_rope`` then ``store_kv`` in one pass (kv_store/rope_paged): rotates q, writes the
    rotated k and v into the paged cache; returns the rotated q (possibly q itself, rotated in place).

    Arguments as in the two ops. k may be left rotated or not: callers read only the returned q and
    the cache. One launch instead of two per attention layer, and k is never written back.
    """
    features = (FP8_KV,) if k_cache.dtype in FP8_DTYPES else ()
    return impl_for("kv_store", "rope_paged", k, features)(
        positions, q, k, v, cos_sin_cache, k_cache, v_cache, slot_mapping, is_neox=is_neox,
        k_scale=k_scale, v_scale=v_scale
    )
