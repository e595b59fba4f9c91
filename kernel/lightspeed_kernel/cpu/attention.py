"""Native paged decode attention on the CPU: one pass over each sequence's pages (csrc/attention.c)."""

from __future__ import annotations

import torch

from ..reference.attention import _check
from ..reference.attention import attention_decode as reference_decode
from ..registry import Priority, register_kernel
from . import native

_CACHE_CODES = {torch.float32: 0, torch.bfloat16: 1}


def _scalar(scale: torch.Tensor | float | None) -> float:
    if scale is None:
        return 1.0
    return float(scale.reshape(-1)[0]) if isinstance(scale, torch.Tensor) else float(scale)


@register_kernel("attention", "decode", name="native_decode", solution="native", priority=Priority.PERFORMANT,
                 capability="cpu", dtypes=(torch.float32,), features=("soft_cap",))
def attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    scale: float,
    soft_cap: float | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    out: torch.Tensor | None = None,
    host_lengths=None,
) -> torch.Tensor:
    # q: [T, Hq, D] fp32; caches: [num_pages, page_size, Hkv, D] fp32 / bf16; page_table: int32 [B, P];
    # query_start_loc: int32 [B+1]; seq_lens: int32 [B] -> out [T, Hq, D]
    _check(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    if k_cache.dtype not in _CACHE_CODES or v_cache.dtype != k_cache.dtype:
        # fp16 caches beside an fp32 model: rare enough to leave to the reference
        return reference_decode(q, k_cache, v_cache, page_table, query_start_loc, seq_lens,
                                max_query_len=max_query_len, scale=scale, soft_cap=soft_cap, k_scale=k_scale,
                                v_scale=v_scale, out=out, host_lengths=host_lengths)
    if q.dtype != torch.float32 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("native decode attention: q must be float32 and the caches contiguous")
    target = out if out is not None and out.is_contiguous() and out.dtype == torch.float32 else None
    result = torch.empty_like(q) if target is None else target
    batch = seq_lens.numel()
    if q.shape[0] == 0 or batch == 0:
        return out if out is not None else result
    qc = q if q.stride(2) == 1 else q.contiguous()  # the fused QKV view is read in place
    table = page_table if page_table.stride(-1) == 1 else page_table.contiguous()
    qsl = query_start_loc.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    rc = native.call(
        "ls_paged_attention_decode", qc.data_ptr(), qc.stride(0), qc.stride(1), k_cache.data_ptr(),
        v_cache.data_ptr(), _CACHE_CODES[k_cache.dtype], page_size, num_kv_heads, head_dim, table.data_ptr(),
        table.stride(0), qsl.data_ptr(), lens.data_ptr(), batch, num_q_heads, float(scale), float(soft_cap or 0.0),
        _scalar(k_scale), _scalar(v_scale), result.data_ptr())
    if rc:
        raise MemoryError("native decode attention: cannot allocate its work buffers")
    if out is not None and target is None:
        return out.copy_(result)
    return result
