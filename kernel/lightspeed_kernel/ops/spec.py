"""Speculative decoding ops (family ``spec``). Dispatch dtype: ``history.dtype`` (int32)."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
                 n_max: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-lookup drafts for token rows (spec/ngram_lookup).

    history: [N, W] int32 token rows; rows: [R] int64, the rows to draft for; lengths: [N], the
    known tokens of each row; max_len: a host-side bound of lengths[rows] (no device read).
    For row r of length L: the longest tail of n_min..n_max tokens that also ends earlier, at
    i <= L - 2; ties go to the i with the most known tokens after it (at most k), then the latest
    (so a repeating run drafts k tokens, not the one after its last repeat); its drafts are the
    known tokens after i, at most k.
    Returns (drafts int64 [R, k], 0 past the match's known tokens; matched counts int32 [R]).
    """
    return impl_for("spec", "ngram_lookup", history)(history, rows, lengths, k=k, n_min=n_min, n_max=n_max,
                                                     max_len=max_len)
