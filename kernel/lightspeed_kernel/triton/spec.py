"""Prompt lookup (spec/ngram_lookup) in one launch: one program per drafted row.

Each program scans its row in blocks of positions i, computing the length of the match of the
row's tail that ends at i (N_MAX shifted loads per block, which hit L1/L2), keeps the best
(length, position) score, and finally copies the k tokens after it. One launch, where the torch
reference takes a few element-wise passes per tail length (launch overhead on the step path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check, next_pow2, register


@triton.jit
def _ngram_lookup_kernel(history_ptr, rows_ptr, lengths_ptr, drafts_ptr, valid_ptr, stride_h, k,
                         N_MIN: tl.constexpr, N_MAX: tl.constexpr, BLOCK: tl.constexpr, K_PAD: tl.constexpr):
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r).to(tl.int64)
    length = tl.load(lengths_ptr + row).to(tl.int64)
    base = history_ptr + row * stride_h
    best = tl.full((), -1, tl.int64)
    # Scan only where a match can end: i <= length - 2.
    for start in range(0, length - 1, BLOCK):
        i = start + tl.arange(0, BLOCK).to(tl.int64)
        run = i <= length - 2
        match_len = tl.zeros((BLOCK,), tl.int64)
        for j in tl.static_range(N_MAX):
            # A tail longer than the row (j >= length) needs i >= j >= length: excluded by run.
            tail = tl.load(base + tl.maximum(length - 1 - j, 0))
            ok = run & (i >= j)
            tok = tl.load(base + i - j, mask=ok, other=0)
            run = ok & (tok == tail)
            match_len += run.to(tl.int64)
        # Longest match, then the most known tokens after it (at most k), then the latest.
        follow = tl.minimum(length - 1 - i, k)
        score = tl.where(match_len >= N_MIN, (match_len * (k + 1) + follow) * (length + 1) + i, -1)
        best = tl.maximum(best, tl.max(score, axis=0))
    end = tl.maximum(best, 0) % (length + 1)
    m = tl.arange(0, K_PAD).to(tl.int64)
    at = end + 1 + m
    # (Scalar conditions are broadcast through a vector first: the interpreter rejects scalar masks.)
    known = (at < length) & (m < k) & (m * 0 + best >= 0)
    draft = tl.load(base + at, mask=known, other=0)
    tl.store(drafts_ptr + r * k + m, draft.to(tl.int64), mask=m < k)
    tl.store(valid_ptr + r, tl.sum(known.to(tl.int32), axis=0))


@register("spec", "ngram_lookup", "triton_ngram_lookup", (torch.int32,))
def ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
                 n_max: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """history [N, W] int32 (last dim contiguous), rows [R] int64, lengths [N] -> (drafts [R, k], valid [R])."""
    check(history.dim() == 2 and history.stride(1) == 1, "history must be [N, W] with contiguous rows")
    check(1 <= n_min <= n_max and k >= 1, f"need 1 <= n_min <= n_max and k >= 1, got {n_min}, {n_max}, {k}")
    num = rows.shape[0]
    drafts = torch.empty((num, k), dtype=torch.int64, device=history.device)
    valid = torch.empty(num, dtype=torch.int32, device=history.device)
    if num == 0:
        return drafts, valid
    block = min(1024, max(16, next_pow2(max_len)))
    _ngram_lookup_kernel[(num,)](history, rows, lengths, drafts, valid, history.stride(0), k, N_MIN=n_min,
                                 N_MAX=n_max, BLOCK=block, K_PAD=next_pow2(k), num_warps=4)
    return drafts, valid
