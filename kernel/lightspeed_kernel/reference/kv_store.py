"""Write the K/V of new tokens into a paged cache by slot (page * page_size + offset)."""

from __future__ import annotations

import torch

from ._register import reference


def _to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale) -> torch.Tensor:
    if scale is None:
        return x.to(cache_dtype)
    # Saturate to the format's finite range, as the Triton store does: e4m3 has no infinity, so a
    # plain cast turns anything past 448 into NaN, which then poisons every attention score.
    limit = torch.finfo(cache_dtype).max
    return (x.float() / scale).clamp(-limit, limit).to(cache_dtype)


@reference("kv_store", "paged", features=("fp8_kv",))
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
    # k, v: [T, Hkv, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D]; slot_mapping: [T] int64,
    # -1 = skip (padding tokens). With k_scale / v_scale (fp8 caches) the cache holds k / k_scale.
    page_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    pages, offsets = slots // page_size, slots % page_size
    k_cache[pages, offsets] = _to_cache(k[valid], k_cache.dtype, k_scale)
    v_cache[pages, offsets] = _to_cache(v[valid], v_cache.dtype, v_scale)


@reference("kv_store", "rope_paged", features=("fp8_kv",))
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
    # The definition: the two public ops in sequence. Each dispatches to its own best implementation
    # for the platform (on CPU the native rope and store), so a platform without a fused kernel
    # loses nothing against calling them separately.
    from .. import ops

    q, k = ops.apply_rope(positions, q, k, cos_sin_cache, is_neox=is_neox)
    ops.store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    return q
