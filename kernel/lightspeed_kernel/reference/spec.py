"""Speculative decoding helpers: prompt lookup (n-gram drafts) over token rows on the device."""

from __future__ import annotations

import torch

from ._register import reference


@reference("spec", "ngram_lookup")
def ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
                 n_max: int, max_len: int, out_drafts: torch.Tensor | None = None,
                 out_valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    drafts, valid = _ngram_lookup(history, rows, lengths, k=k, n_min=n_min, n_max=n_max, max_len=max_len)
    if out_drafts is not None:
        out_drafts[rows] = drafts
        out_valid[rows] = valid
    return drafts, valid


def _ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
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


def _row_layout(query_start_loc: torch.Tensor, num_rows: int, n: int) -> tuple[torch.Tensor, ...]:
    """For indices 0..n-1 (inputs or samples) and the first `num_rows` rows: (in one of them, its
    row clamped to a valid one, its position in the row, that row's token count). No host read:
    searchsorted, not repeat_interleave (whose output size the host would wait for)."""
    qsl = query_start_loc[: num_rows + 1].long()
    index = torch.arange(n, device=qsl.device)
    rows = torch.searchsorted(qsl[1:], index, right=True)
    inside = rows < num_rows
    rows = rows.clamp(max=max(num_rows - 1, 0))
    return inside, rows, index - qsl[rows], (qsl[1:] - qsl[:-1])[rows]


@reference("spec", "verify")
def spec_verify(tokens: torch.Tensor, input_ids: torch.Tensor, query_start_loc: torch.Tensor, *, num_decodes: int,
                max_query_len: int, chain_ok: torch.Tensor | None = None, matched: torch.Tensor | None = None,
                sample_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    device, num = tokens.device, tokens.shape[0]
    ok = torch.ones(num_decodes, dtype=torch.bool, device=device) if chain_ok is None else chain_ok.bool()
    if num_decodes == 0:
        parts = 3 if matched is not None else 2
        return (torch.zeros(parts, 0, dtype=torch.int64, device=device), torch.ones(num, dtype=torch.bool, device=device),
                torch.zeros(num, dtype=torch.int64, device=device))
    decode, rows, pos, row_tokens = _row_layout(query_start_loc, num_decodes, num)
    # The draft after sample (= input) i of a decode row is input i + 1.
    after = torch.arange(1, num + 1, device=device)
    following = torch.where(after < input_ids.shape[0], input_ids[after.clamp(max=max(input_ids.shape[0] - 1, 0))], -1)
    match = decode & (pos < row_tokens - 1) & (tokens == following)
    # Leading matches per row = position of its first miss (a row's last position always misses).
    miss_pos = torch.where(match | ~decode, 1 << 20, pos)
    lead = torch.full((num_decodes,), 1 << 20, dtype=torch.int64, device=device)
    lead.scatter_reduce_(0, rows, miss_pos, reduce="amin")
    accepted = torch.where(ok, lead, 0) + 1
    keep = ~decode | (pos < accepted[rows])
    rejected = torch.where(decode, row_tokens - accepted[rows], 0)
    parts = [accepted, ok.long()]
    if matched is not None:
        parts.append(matched[sample_slots[query_start_loc[:num_decodes].long()]].long())
    return torch.stack(parts), keep, rejected


@reference("spec", "shift_rows")
def spec_shift_rows(positions: torch.Tensor, input_ids: torch.Tensor, seq_lens: torch.Tensor,
                    page_table: torch.Tensor, query_start_loc: torch.Tensor, deferred_mask: torch.Tensor,
                    deferred_src: torch.Tensor, prev_rejected: torch.Tensor, prev_sampled: torch.Tensor, *,
                    page_size: int, max_query_len: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    qsl = query_start_loc.long()
    num_rows, num_tokens = qsl.shape[0] - 1, positions.shape[0]
    if num_tokens == 0:
        return positions.clone(), positions.clone(), seq_lens.clone(), torch.zeros_like(qsl[1:])
    first = qsl[:-1].clamp(max=num_tokens - 1)
    deferred = (qsl[1:] > qsl[:-1]) & deferred_mask[first]
    src = deferred_src[first].long()
    shift = torch.where(deferred, prev_rejected[torch.where(deferred, src, 0)], 0)
    _, token_rows, pos_in_row, _ = _row_layout(query_start_loc, num_rows, num_tokens)
    moved = positions - shift[token_rows]
    pages = page_table[token_rows, moved // page_size]
    slot_mapping = pages.long() * page_size + moved % page_size
    # Each input is in one row: a where over inputs (no duplicate indices, no host read).
    bonus = prev_sampled[torch.where(deferred, src - shift, 0)][token_rows].to(input_ids.dtype)
    input_ids.copy_(torch.where((pos_in_row == 0) & deferred[token_rows], bonus, input_ids))
    return moved, slot_mapping, seq_lens - shift.to(seq_lens.dtype), shift


@reference("spec", "fill_drafts")
def spec_fill_drafts(input_ids: torch.Tensor, query_start_loc: torch.Tensor, drafts: torch.Tensor,
                     sample_slots: torch.Tensor, *, num_decodes: int, max_query_len: int) -> None:
    if num_decodes == 0 or input_ids.shape[0] == 0:
        return
    decode, rows, pos, _ = _row_layout(query_start_loc, num_decodes, input_ids.shape[0])
    slots = sample_slots[query_start_loc[:num_decodes].long()][rows]
    # A decode row's inputs after its first are its draft slots.
    draft = drafts[slots, (pos - 1).clamp(min=0, max=drafts.shape[1] - 1)].to(input_ids.dtype)
    input_ids.copy_(torch.where(decode & (pos > 0), draft, input_ids))


@reference("spec", "ngram_record")
def ngram_record(history: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_indices: torch.Tensor, sample_slots: torch.Tensor, query_start_loc: torch.Tensor, *,
                 num_decodes: int, num_decode_tokens: int, max_query_len: int,
                 keep: torch.Tensor | None = None, out_slots: torch.Tensor | None = None) -> None:
    if out_slots is not None:  # a decode row's slot is its first sample's; later samples are rows
        out_slots[:num_decodes] = sample_slots[query_start_loc[:num_decodes].long()]
        out_slots[num_decodes:] = sample_slots[num_decode_tokens:]
    # The sample at logits index i follows input position p: it is the token at p + 1.
    at = positions[logits_indices] + 1
    history[sample_slots, at.clamp(max=history.shape[1] - 1)] = tokens.to(history.dtype)
    ends = at + 1 if keep is None else torch.where(keep, at + 1, 0)
    # A slot's samples are all in its one row: the max over them is the row's last kept sample.
    lengths.scatter_reduce_(0, sample_slots, ends.to(lengths.dtype), reduce="amax", include_self=False)
