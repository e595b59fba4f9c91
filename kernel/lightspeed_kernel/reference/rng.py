"""Counter-based random numbers for sampling: uniform(seed, offset, token) by integer hashing.

Design note. Sampling must reproduce a seed exactly, per row, on any device, with no generator
object and no host sync; so the random number of a (row, token) is a pure function of the row's
``seed`` (int64), its ``offset`` (int64, e.g. the number of tokens it generated so far) and the
token index. Everything is 32-bit unsigned arithmetic, written here on int64 tensors so no value
ever overflows (products are split into 16-bit halves): a Triton kernel computing the same steps
on uint32 gets the same bits.

    mix32(x):  x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16   (mod 2^32)
    row key:   key = mix32(seed_lo ^ 0x9E3779B9); key = mix32(key ^ seed_hi)
               key = mix32(key ^ offset_lo);      key = mix32(key ^ offset_hi)
    token:     bits = mix32(mix32(token ^ key) ^ 0x85EBCA6B)
    uniform:   u = (2 * (bits >> 9) + 1) / 2^24        in (0, 1); 24 significant bits: exact in fp32

``*_lo`` / ``*_hi`` are the low / high 32 bits of the two's-complement int64.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
TOKEN_SALT = 0x85EBCA6B
_MUL_A = 0x7FEB352D
_MUL_B = 0x846CA68B


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    # (x * constant) mod 2^32 for x in [0, 2^32) without int64 overflow
    low = (x & 0xFFFF) * constant
    high = (((x >> 16) * (constant & 0xFFFF)) & 0xFFFF) << 16
    return (low + high) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Bijective 32-bit integer hash (Wellons' lowbias32) of int64 tensors holding uint32 values."""
    x = x ^ (x >> 16)
    x = _mul32(x, _MUL_A)
    x = x ^ (x >> 15)
    x = _mul32(x, _MUL_B)
    return x ^ (x >> 16)


def row_keys(seeds: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[S] int64 seeds and offsets -> [S] int64 keys holding uint32 values."""
    seeds, offsets = seeds.long(), offsets.long()
    key = mix32((seeds & MASK32) ^ GOLDEN)
    key = mix32(key ^ ((seeds >> 32) & MASK32))
    key = mix32(key ^ (offsets & MASK32))
    return mix32(key ^ ((offsets >> 32) & MASK32))


def uniform(seeds: torch.Tensor, offsets: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[S, num_tokens] fp32 uniforms in (0, 1), one per (row, token)."""
    keys = row_keys(seeds, offsets)[:, None]
    tokens = torch.arange(num_tokens, dtype=torch.int64, device=keys.device)[None, :]
    bits = mix32(mix32(tokens ^ keys) ^ TOKEN_SALT)
    return ((bits >> 9) * 2 + 1).float() * (1.0 / (1 << 24))
