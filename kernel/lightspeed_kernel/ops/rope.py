"""Rotary embedding ops (family ``rope``). Dispatch dtype: ``q.dtype``."""

from __future__ import annotations

import torch

from ..reference.rope import rope_cos_sin_cache, yarn_get_mscale
from ._dispatch import impl_for

__all__ = ["apply_rope", "rope_cos_sin_cache", "yarn_get_mscale"]


def apply_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``rot_dim`` features of q and k by their positions (rope/rotary).

    positions: [T] int64; q: [T, Hq, D]; k: [T, Hkv, D]; cos_sin_cache: [max_pos, rot_dim]
    (cos half ‖ sin half, from :func:`rope_cos_sin_cache`). ``is_neox``: rotate halves (NeoX/Llama)
    or interleaved pairs (GPT-J). Returns (q, k); implementations may rotate in place.
    """
    return impl_for("rope", "rotary", q)(positions, q, k, cos_sin_cache, is_neox=is_neox)
