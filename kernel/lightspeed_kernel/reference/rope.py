"""Rotary position embedding: the cos/sin cache builder (with HF ``rope_scaling`` variants) and
the rotation itself (NeoX: halves; GPT-J: interleaved pairs), over the first ``rot_dim`` features.

Cache layout: ``[max_position, rot_dim]`` fp32-computed, cos of the rot_dim/2 frequencies in the
first half, sin in the second. Scaling follows transformers' rope init functions (llama3, yarn
with DeepSeek's mscale / mscale_all_dim, linear), so HF checkpoints rotate identically.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ._register import reference


def _base_inv_freq(rot_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    old_context = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are interpolated, short ones kept, the band between smoothly blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature: 0.1·mscale·ln(scale) + 1 (1 for scale ≤ 1).

    DeepSeek-V2/V3 also multiply the softmax scale by ``yarn_get_mscale(factor, mscale_all_dim)**2``.
    """
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rot_dim: int, base: float, scaling: Mapping[str, Any]) -> tuple[torch.Tensor, float]:
    factor = scaling["factor"]
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1
    original_max = scaling["original_max_position_embeddings"]
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (rot_dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, rot_dim, 2, dtype=torch.int64).float() / rot_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep_extrapolated = 1 - ramp
    inv_freq = interpolation * (1 - keep_extrapolated) + extrapolation * keep_extrapolated
    return inv_freq, float(attention_factor)


def rope_cos_sin_cache(
    rot_dim: int,
    max_position: int,
    base: float,
    scaling: Mapping[str, Any] | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Build ``[max_position, rot_dim]`` = cos ‖ sin of position × inverse frequency.

    ``scaling`` is a HF ``rope_scaling`` / ``rope_parameters`` dict (``rope_type`` or legacy
    ``type``): None/"default", "linear" (factor), "llama3" (factor, low/high_freq_factor,
    original_max_position_embeddings), "yarn" (factor, original_max_position_embeddings,
    beta_fast/slow, mscale, mscale_all_dim, attention_factor, truncate).
    """
    if rot_dim % 2:
        raise ValueError(f"rot_dim must be even, got {rot_dim}")
    kind = None
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
    inv_freq = _base_inv_freq(rot_dim, base)
    attention_factor = 1.0
    if kind in (None, "default"):
        pass
    elif kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif kind == "yarn":
        inv_freq, attention_factor = _yarn_inv_freq(rot_dim, base, scaling)
    else:
        raise ValueError(f"unsupported rope scaling type {kind!r} (supported: linear, llama3, yarn)")
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    cache = torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)
    return cache.to(dtype=dtype, device=device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> None:
    # x: [T, H, D] rotated in place over its first rot_dim features; cos, sin: [T, 1, rot_dim/2]
    rot_dim = cos.shape[-1] * 2
    rot = x[..., :rot_dim].float()
    if is_neox:
        x1, x2 = rot[..., : rot_dim // 2], rot[..., rot_dim // 2 :]
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    x[..., :rot_dim] = rotated.to(x.dtype)


@reference("rope", "rotary")
def apply_rope(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    # positions: [T] int64; q: [T, Hq, D]; k: [T, Hkv, D]; cos_sin_cache: [max_pos, rot_dim]
    # Rotates q and k in place (features past rot_dim untouched) and returns them.
    half = cos_sin_cache.shape[-1] // 2
    cos_sin = cos_sin_cache.index_select(0, positions.long()).float()
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    _rotate(q, cos, sin, is_neox)
    _rotate(k, cos, sin, is_neox)
    return q, k
