"""Rotary position embedding with a precomputed cos/sin cache (HF `rope_scaling` supported)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from lightspeed_kernel import ops
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotates the first `rotary_dim` features of every query and key head.

    `scaling` is a Hugging Face `rope_scaling` dict (`rope_type` one of default, linear, llama3,
    yarn) or None. The cache `[max_position, rotary_dim]` (cos half ‖ sin half) is a
    non-persistent buffer, so it follows the module across `.to(device)`.
    """

    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: Mapping | None = None, rotary_dim: int | None = None, is_neox: bool = True,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        self.is_neox = is_neox
        scaling = dict(scaling) if scaling else None
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
        cache = ops.rope_cos_sin_cache(self.rotary_dim, max_position, base, scaling=scaling,
                                       dtype=dtype or torch.get_default_dtype(),
                                       device=device or torch.get_default_device())
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions int64 [T], q [T, Hq, D], k [T, Hkv, D] -> rotated (q, k)."""
        return ops.apply_rope(positions, q, k, self.cos_sin_cache, is_neox=self.is_neox)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, max_position={self.cos_sin_cache.shape[0]}"
