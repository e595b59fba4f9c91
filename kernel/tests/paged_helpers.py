"""Build paged batches for the kv-store and attention tests (shared by name, not a test file)."""

from __future__ import annotations

import torch


def build_batch(cached_lens, q_lens, page_size, num_kv_heads, head_dim, dtype, *, seed=0, spare_pages=3):
    """Random per-request K/V scattered over shuffled pages (page 0 unused) of a fresh cache.

    Returns dict with k_seq / v_seq (per request [S, Hkv, D] dense tensors, the ground truth),
    page_table [B, P] int32 (unused entries 0), slot_mapping [T] of the new tokens, the full-sequence
    slots per request, query_start_loc, seq_lens, and empty caches sized for the batch.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(cached_lens, q_lens, strict=True)]
    pages_per_req = [-(-s // page_size) for s in seq_lens]
    num_pages = 1 + sum(pages_per_req) + spare_pages
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    max_pages = max(pages_per_req, default=0) + 1
    page_table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    k_seq, v_seq, seq_slots, new_slots = [], [], [], []
    for b, (seq_len, n_pages) in enumerate(zip(seq_lens, pages_per_req, strict=True)):
        pages = [order.pop() for _ in range(n_pages)]
        page_table[b, :n_pages] = torch.tensor(pages, dtype=torch.int32)
        slots = torch.tensor(
            [pages[i // page_size] * page_size + i % page_size for i in range(seq_len)], dtype=torch.int64
        )
        seq_slots.append(slots)
        new_slots.append(slots[cached_lens[b] :])
        k_seq.append(torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype))
        v_seq.append(torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype))
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    cache_shape = (num_pages, page_size, num_kv_heads, head_dim)
    return {
        "k_seq": k_seq,
        "v_seq": v_seq,
        "page_table": page_table,
        "seq_slots": seq_slots,
        "slot_mapping": torch.cat(new_slots) if new_slots else torch.zeros(0, dtype=torch.int64),
        "query_start_loc": qsl,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "cache_shape": cache_shape,
    }
