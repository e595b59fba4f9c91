"""Speculative decoding helpers: prompt lookup (n-gram drafts) over token rows on the device."""

from __future__ import annotations

import torch

from ._register import reference


@reference("spec", "ngram_lookup")
def ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
                 n_max: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Batched over [R, max_len]: one element-wise pass per tail length compared (see ops/spec.py).
    width = min(max_len, history.shape[1])
    device = history.device
    tokens = history[rows, :width]
    lengths = lengths[rows].long()
    col = torch.arange(width, device=device)
    last = lengths[:, None] - 1 - torch.arange(n_max, device=device)[None, :]  # the tail, newest first
    tails = tokens.gather(1, last.clamp(min=0, max=max(width - 1, 0)))
    # run[r, i]: tokens i - j .. i equal the row's last j + 1 tokens, for the j of the pass; a
    # following token must exist (i <= L - 2). A tail longer than the row needs i >= j >= L: none.
    run = col[None, :] <= lengths[:, None] - 2
    match_len = torch.zeros(tokens.shape, dtype=torch.int32, device=device)
    for j in range(min(n_max, width)):
        run[:, j:] &= tokens[:, : width - j] == tails[:, j: j + 1]
        run[:, :j] = False
        match_len += run
    # Longest match, then the most known tokens after it (at most k: a match just before the tail
    # of a repeating run has one), then the latest.
    follow = (lengths[:, None] - 1 - col[None, :]).clamp(min=0, max=k)
    score = torch.where(match_len >= n_min, (match_len.long() * (k + 1) + follow) * width + col[None, :], -1)
    best, _ = score.max(dim=1) if width else (torch.full_like(lengths, -1), None)
    end = best.clamp(min=0) % max(width, 1)
    at = end[:, None] + 1 + torch.arange(k, device=device)[None, :]
    known = (best >= 0)[:, None] & (at < lengths[:, None])
    drafts = torch.where(known, tokens.gather(1, at.clamp(max=max(width - 1, 0))).long(), 0)
    return drafts, known.sum(dim=1, dtype=torch.int32)
