"""Paged attention references (prefill over a cached prefix; decode with 1..16 query tokens).

Each request's new tokens are the last ``q_len`` of its ``seq_len`` cached tokens, so query i
(0-based among the new ones) sits at absolute position ``seq_len - q_len + i`` and sees keys
0..that position: the causal mask is aligned to the bottom-right of the [q_len, seq_len] score
matrix. Query head h reads KV head h // (Hq / Hkv) (GQA). Scores, softmax and the weighted sum
are fp32; the output is rounded once to q's dtype.

Prefill loops over requests (their lengths differ wildly) and over query chunks of a request to
bound memory; decode pads the batch to [B, max_q] and runs it as one batched matmul.
"""

from __future__ import annotations

import torch

from ._register import reference

# Bound on the fp32 elements of one step's scores / gathered K, so a long prompt or a large
# decode batch is processed in pieces instead of allocating gigabytes (256 MiB here).
_ELEMENT_BUDGET = 1 << 26
_MAX_QUERY_CHUNK = 1024


def _dequant(x: torch.Tensor, scale) -> torch.Tensor:
    x = x.float()
    return x if scale is None else x * scale


def _softmax_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    masked: torch.Tensor,
    scale: float,
    soft_cap,
    group: int,
) -> torch.Tensor:
    # q: [..., Hkv, G*Q, D] rows ordered (g, q); k, v: [..., Hkv, S, D];
    # masked: [..., 1, Q, S] True where a key is invisible to a query -> [..., Hkv, G*Q, D]
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if soft_cap is not None and soft_cap > 0:
        scores = scores.div_(soft_cap).tanh_().mul_(soft_cap)
    shape = scores.shape
    grouped = scores.view(*shape[:-2], group, shape[-2] // group, shape[-1])  # [..., Hkv, G, Q, S]
    grouped.masked_fill_(masked.unsqueeze(-3), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


def _gather_pages(cache: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    # cache: [num_pages, page_size, Hkv, D]; pages: [..., P] -> [..., P * page_size, Hkv, D]
    gathered = cache[pages]
    return gathered.flatten(-4, -3)


def host_or_device_lengths(query_start_loc, seq_lens, host_lengths) -> tuple[list[int], list[int]]:
    """(query starts [B+1], sequence lengths [B]) as Python ints: from the op's ``host_lengths``
    when the caller gave them, else read back from the tensors (a sync on a GPU)."""
    if host_lengths is not None:
        return host_lengths.as_lists()
    return query_start_loc.tolist(), seq_lens.tolist()


def _check(q, k_cache, v_cache, page_table, query_start_loc, seq_lens):
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"attention: q {list(q.shape)}, k_cache {list(k_cache.shape)}, v_cache {list(v_cache.shape)}"
        )
    if q.shape[1] % k_cache.shape[2] or q.shape[2] != k_cache.shape[3]:
        raise ValueError(
            f"attention: {q.shape[1]} q heads / head dim {q.shape[2]} vs cache {list(k_cache.shape)}"
        )
    if query_start_loc.numel() != seq_lens.numel() + 1 or page_table.shape[0] != seq_lens.numel():
        raise ValueError("attention: query_start_loc must be [B+1], seq_lens [B], page_table [B, P]")


@reference("attention", "prefill", features=("fp8_kv", "soft_cap"))
def attention_prefill(
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
    # q: [T, Hq, D]; caches: [num_pages, page_size, Hkv, D]; page_table: [B, P] int32;
    # query_start_loc: [B+1] int32; seq_lens: [B] int32 (new tokens included) -> [T, Hq, D]
    _check(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    num_tokens, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    starts, lens = host_or_device_lengths(query_start_loc, seq_lens, host_lengths)
    for b, seq_len in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_pages = -(-seq_len // page_size)
        pages = page_table[b, :num_pages].long()
        k = _dequant(_gather_pages(k_cache, pages)[:seq_len], k_scale).permute(1, 0, 2)  # [Hkv, S, D]
        v = _dequant(_gather_pages(v_cache, pages)[:seq_len], v_scale).permute(1, 0, 2)
        key_pos = torch.arange(seq_len, device=q.device)
        query_chunk = min(_MAX_QUERY_CHUNK, max(1, _ELEMENT_BUDGET // (num_q_heads * seq_len)))
        for c_start in range(0, q_len, query_chunk):
            c_end = min(q_len, c_start + query_chunk)
            chunk = q[q_start + c_start : q_start + c_end].float()  # [C, Hq, D]
            c = c_end - c_start
            # [C, Hkv, G, D] -> [Hkv, G*C, D] with rows ordered (g, c)
            qh = (
                chunk.view(c, num_kv_heads, group, head_dim)
                .permute(1, 2, 0, 3)
                .reshape(num_kv_heads, group * c, head_dim)
            )
            query_pos = seq_len - q_len + torch.arange(c_start, c_end, device=q.device)
            masked = (key_pos[None, :] > query_pos[:, None])[None]  # [1, C, S]
            attended = _softmax_attend(qh, k, v, masked, scale, soft_cap, group)  # [Hkv, G*C, D]
            attended = (
                attended.view(num_kv_heads, group, c, head_dim)
                .permute(2, 0, 1, 3)
                .reshape(c, num_q_heads, head_dim)
            )
            out[q_start + c_start : q_start + c_end] = attended.to(out.dtype)
    return out


@reference("attention", "decode", features=("fp8_kv", "soft_cap"))
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
    # Same contract as attention_prefill, for 1..16 query tokens per request.
    _check(q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
    out = torch.empty_like(q) if out is None else out
    batch = seq_lens.numel()
    if q.shape[0] == 0 or batch == 0:
        return out
    page_size, num_kv_heads, head_dim = k_cache.shape[1:]
    max_q = max(int(max_query_len), 1)
    longest = max(host_lengths.seq_lens) if host_lengths is not None else seq_lens.max()
    max_kv = -(-int(longest) // page_size) * page_size
    per_request = max_kv * max(num_kv_heads * head_dim, q.shape[1] * max_q)
    step = max(1, _ELEMENT_BUDGET // max(per_request, 1))
    attend = (max_q, scale, soft_cap, k_scale, v_scale)
    if step >= batch:
        _decode_batch(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *attend, out)
        return out
    starts = host_or_device_lengths(query_start_loc, seq_lens, host_lengths)[0]
    for first in range(0, batch, step):
        last = min(batch, first + step)
        lo, hi = starts[first], starts[last]
        _decode_batch(
            q[lo:hi], k_cache, v_cache, page_table[first:last], query_start_loc[first : last + 1] - lo,
            seq_lens[first:last], *attend, out[lo:hi],
        )  # fmt: skip
    return out


def _decode_batch(
    q, k_cache, v_cache, page_table, query_start_loc, seq_lens, max_q, scale, soft_cap, k_scale, v_scale, out
):
    """Decode attention of a batch as one padded [B, max_q] problem, written into ``out``."""
    num_tokens, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    batch = seq_lens.numel()
    if num_tokens == 0:
        return
    device = q.device
    q_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()  # [B]
    seq_lens_l = seq_lens.long()
    max_pages = -(-int(seq_lens_l.max()) // page_size)
    max_kv = max_pages * page_size
    # scatter tokens into a padded [B, max_q] grid
    token_req = torch.repeat_interleave(torch.arange(batch, device=device), q_lens, output_size=num_tokens)
    token_idx = torch.arange(num_tokens, device=device) - query_start_loc[:-1].long()[token_req]
    padded_q = q.new_zeros(batch, max_q, num_q_heads, head_dim, dtype=torch.float32)
    padded_q[token_req, token_idx] = q.float()
    # pages past a request's length may hold anything: read the padding page 0 instead
    pages = page_table[:, :max_pages].long()
    live = torch.arange(max_pages, device=device)[None, :] * page_size < seq_lens_l[:, None]
    pages = torch.where(live, pages, torch.zeros_like(pages))
    k = _dequant(_gather_pages(k_cache, pages), k_scale)  # [B, S, Hkv, D]
    v = _dequant(_gather_pages(v_cache, pages), v_scale)
    k, v = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # [B, Hkv, S, D]
    qh = padded_q.view(batch, max_q, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    qh = qh.reshape(batch, num_kv_heads, group * max_q, head_dim)
    query_pos = seq_lens_l[:, None] - q_lens[:, None] + torch.arange(max_q, device=device)[None, :]  # [B, Q]
    key_pos = torch.arange(max_kv, device=device)
    # [B, 1, Q, S]; also hides keys past seq_len. Padding rows (i >= q_len) see keys past
    # seq_len: finite garbage, dropped below.
    masked = (key_pos[None, None, :] > query_pos[:, :, None])[:, None]
    attended = _softmax_attend(qh, k, v, masked, scale, soft_cap, group)  # [B, Hkv, G*Q, D]
    attended = attended.view(batch, num_kv_heads, group, max_q, head_dim).permute(0, 3, 1, 2, 4)
    attended = attended.reshape(batch, max_q, num_q_heads, head_dim)
    out.copy_(attended[token_req, token_idx].to(out.dtype))
