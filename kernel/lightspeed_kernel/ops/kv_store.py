"""Paged KV write op (family ``kv_store``). Dispatch dtype: ``k.dtype``; requests feature
``fp8_kv`` when the cache is fp8."""

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
