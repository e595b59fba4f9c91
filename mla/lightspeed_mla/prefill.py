"""MLA prefill: the non-absorbed attention op, the cache gather it needs, and the form choice.

Absorbed or not, per shape (``choose_prefill_form``). Per (query, key, head) the absorbed form
costs 2·(576 + 512) = 2176 FLOPs against 2·(192 + 128) = 640 non-absorbed: 3.4× more attention
work. Non-absorbed pays instead for up-projecting every key's latent into per-head K and V
(2·512·256 = 262144 FLOPs per key and head) and reads a bigger K/V. Absorbed pays for projecting
queries into latent space and outputs back (another 262144 per query and head). So with q new
tokens over kv keys the absorbed form wins roughly when q·kv·1536 < 262144·(kv − q), i.e. when
a request brings fewer than ~170 new tokens over a long prefix (speculative verify, short
extends); long prompt chunks go non-absorbed, which is also the form whose MMA tiles are
compute-dense (head dim 192/128 per head instead of one 576-wide shared head).
"""

from __future__ import annotations

import numpy as np
import torch

from ._triton import interpreting, require_triton, tl
from .cache import D_LATENT, D_ROPE, MLACache
from .device import device_info
from .kernels import prefill_triton as _k
from .tuning import PrefillTile, prefill_tile

LOG2E = 1.4426950408889634
_UP_PROJ_FLOPS = 2 * D_LATENT * 256  # per key (or query) and head: nope-K and V, 128 each
_ABSORBED_PAIR_FLOPS = 2 * (D_LATENT + D_ROPE + D_LATENT)
_PLAIN_PAIR_FLOPS = 2 * (128 + D_ROPE + 128)


def prefill_flops(q_lens, kv_lens, num_heads: int, form: str) -> int:
    """Model FLOPs of one prefill batch in ``form`` ("absorbed" / "non_absorbed"), causal."""
    q = np.asarray(q_lens, dtype=np.float64)
    kv = np.asarray(kv_lens, dtype=np.float64)
    pairs = float(np.sum(q * (kv - q) + q * (q + 1) / 2))  # prefix rectangle + causal triangle
    if form == "absorbed":
        return int(num_heads * (pairs * _ABSORBED_PAIR_FLOPS + q.sum() * _UP_PROJ_FLOPS))
    if form == "non_absorbed":
        return int(num_heads * (pairs * _PLAIN_PAIR_FLOPS + kv.sum() * _UP_PROJ_FLOPS))
    raise ValueError(f"form must be 'absorbed' or 'non_absorbed', got {form!r}")


def choose_prefill_form(q_lens, kv_lens, num_heads: int) -> str:
    """"absorbed" (run the decode kernel with ragged queries) or "non_absorbed" (this module)."""
    absorbed = prefill_flops(q_lens, kv_lens, num_heads, "absorbed")
    return "absorbed" if absorbed < prefill_flops(q_lens, kv_lens, num_heads, "non_absorbed") else "non_absorbed"


def gather_latent(cache: MLACache, page_table: torch.Tensor, kv_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every request's cached tokens, contiguous and dequantised, for the up-projection.

    page_table: [B, max_pages]; kv_lens: [B] (host or device). Returns (latent [Tk, 512] bf16,
    rope [Tk, 64] bf16) with request b's tokens at cu_seqlens_k[b] .. cu_seqlens_k[b+1].
    """
    lens = kv_lens.to(device=page_table.device, dtype=torch.int64)
    req = torch.repeat_interleave(torch.arange(lens.shape[0], device=page_table.device), lens)
    starts = torch.cumsum(lens, 0) - lens
    pos = torch.arange(req.shape[0], device=page_table.device) - starts[req]
    pages = page_table[req, pos // cache.page_size].long()
    offs = pos % cache.page_size
    latent = cache.latent[pages, offs]
    if cache.scale is not None:
        latent = latent.float() * cache.scale[pages, offs]
    return latent.to(torch.bfloat16), cache.rope[pages, offs]


def mla_prefill(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_q_len: int,
    softmax_scale: float,
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    tile: PrefillTile | None = None,
) -> torch.Tensor:
    """Non-absorbed causal MLA attention over ragged requests (bottom-right aligned).

    q_nope: [T, H, 128]; q_rope: [T, H, 64]; k_nope: [Tk, H, 128]; k_rope: [Tk, 64] (shared by
    heads); v: [Tk, H, 128]; all bf16, last dim contiguous. cu_seqlens_q / cu_seqlens_k: [B+1]
    int32 on the device; max_q_len: host int (grid size). Request b's keys are its cached prefix
    then its new tokens. out: [T, H, 128] bf16; lse: optional contiguous fp32 [T, H] (natural log).
    """
    require_triton()
    T, H, Dn = q_nope.shape
    Tk = k_nope.shape[0]
    Dv = v.shape[-1]
    if q_rope.shape != (T, H, D_ROPE) or k_nope.shape != (Tk, H, Dn) or k_rope.shape != (Tk, D_ROPE):
        raise ValueError("mla_prefill: want q_nope [T,H,Dn], q_rope [T,H,64], k_nope [Tk,H,Dn], k_rope [Tk,64]")
    if v.shape[:2] != (Tk, H):
        raise ValueError("mla_prefill: v must be [Tk, H, Dv]")
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("k_nope", k_nope), ("k_rope", k_rope), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"mla_prefill: {name} must have a contiguous last dim")
    if Dn & (Dn - 1) or Dv & (Dv - 1):
        raise ValueError("mla_prefill: head dims must be powers of two")
    B = cu_seqlens_q.shape[0] - 1
    out = out if out is not None else torch.empty(T, H, Dv, dtype=q_nope.dtype, device=q_nope.device)
    if lse is not None and (lse.shape != (T, H) or not lse.is_contiguous() or lse.dtype != torch.float32):
        raise ValueError("mla_prefill: lse must be contiguous fp32 [T, H]")
    if T == 0 or B == 0:
        return out
    tile = tile or prefill_tile(device_info(q_nope.device).arch_major)
    num_m_blocks = -(-max_q_len // tile.block_m)
    _k._mla_prefill_kernel[(num_m_blocks, H, B)](
        q_nope, q_rope, k_nope, k_rope, v, out, lse if lse is not None else out, cu_seqlens_q, cu_seqlens_k,
        q_nope.stride(0), q_nope.stride(1), q_rope.stride(0), q_rope.stride(1),
        k_nope.stride(0), k_nope.stride(1), k_rope.stride(0),
        v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        H, num_m_blocks, softmax_scale * LOG2E,
        D_NOPE=Dn, D_ROPE=D_ROPE, D_V=Dv, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        WRITE_LSE=lse is not None, DOT_DTYPE=tl.float32 if interpreting() else tl.bfloat16,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )
    return out
