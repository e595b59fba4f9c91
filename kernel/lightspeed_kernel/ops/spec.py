"""Speculative decoding ops (family ``spec``). Dispatch dtype: ``history.dtype`` (int32)."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
                 n_max: int, max_len: int, out_drafts: torch.Tensor | None = None,
                 out_valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-lookup drafts for token rows (spec/ngram_lookup).

    history: [N, W] int32 token rows; rows: [R] int64, the rows to draft for; lengths: [N], the
    known tokens of each row; max_len: a host-side bound of lengths[rows] (no device read).
    For row r of length L: the longest tail of n_min..n_max tokens that also ends earlier, at
    i <= L - 2; ties go to the i with the most known tokens after it (at most k), then the latest
    (so a repeating run drafts k tokens, not the one after its last repeat); its drafts are the
    known tokens after i, at most k.
    Returns (drafts int64 [R, k], 0 past the match's known tokens; matched counts int32 [R]).
    out_drafts [N, k] int64 / out_valid [N] int32 (optional, together): also written at each
    drafted row (out_drafts[rows[r]] = drafts[r]), in the same launch.
    """
    return impl_for("spec", "ngram_lookup", history)(history, rows, lengths, k=k, n_min=n_min, n_max=n_max,
                                                     max_len=max_len, out_drafts=out_drafts, out_valid=out_valid)


def ngram_record(history: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_indices: torch.Tensor, sample_slots: torch.Tensor, query_start_loc: torch.Tensor, *,
                 num_decodes: int, num_decode_tokens: int, max_query_len: int,
                 keep: torch.Tensor | None = None, out_slots: torch.Tensor | None = None) -> None:
    """A step's samples into their token rows, in place (spec/ngram_record).

    Sample i (tokens [S] int64), drawn after input logits_indices[i] (int64 [S]) at position p
    (positions [T] int64), is token p + 1 of row sample_slots[i] (int64 [S]) of history [N, W]
    int32 (clamped to W - 1). Sampling rows: decode row b (b < num_decodes) owns samples
    query_start_loc[b]..[b+1] (int32 [B+1]; sample index = input index, num_decode_tokens in
    all), each later sample is a row of its own; a row's slot then knows its tokens through its
    last kept sample (keep bool [S], None: all): lengths[slot] (int64 [N]) = p + 2 of that sample.
    No slot may own two rows. out_slots (optional, int64 [num_decodes + S - num_decode_tokens]):
    each sampling row's slot is written there, in row order (the rows to search next, with no upload).
    """
    impl_for("spec", "ngram_record", history)(history, lengths, tokens, positions, logits_indices, sample_slots,
                                              query_start_loc, num_decodes=num_decodes,
                                              num_decode_tokens=num_decode_tokens, max_query_len=max_query_len,
                                              keep=keep, out_slots=out_slots)


def spec_verify(tokens: torch.Tensor, input_ids: torch.Tensor, query_start_loc: torch.Tensor, *, num_decodes: int,
                max_query_len: int, chain_ok: torch.Tensor | None = None, matched: torch.Tensor | None = None,
                sample_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verification of a step's drafts, in one pass (spec/verify).

    tokens: [S] int64, the target's samples; decode row b (b < num_decodes) samples every one of
    its query_start_loc[b]..[b+1] inputs, in order, first in `tokens` (sample index = input index);
    later samples are prefills'. input_ids: [T] int64, the step's inputs: the draft after position
    j of a row is its input j + 1. query_start_loc: [B+1] int32 on the device; max_query_len: a
    host bound of the decode rows' tokens. chain_ok: optional bool [num_decodes], False zeroes a
    row's accepted drafts. matched: optional int32 [N] per slot, gathered at each decode row's slot
    (`sample_slots` [S] int64, the slot of each sample) into the verdict's third row.
    Returns (verdict int64 [2 or 3, num_decodes]: accepted tokens 1..k+1 (leading drafts equal to
    the target's token, plus one), chain ok as 0/1, [matched at the row's slot];
    keep bool [S]: the sample is kept (prefills: True); rejected int64 [S]: drafts its row rejected
    (prefills: 0)).
    """
    return impl_for("spec", "verify", tokens)(tokens, input_ids, query_start_loc, num_decodes=num_decodes,
                                              max_query_len=max_query_len, chain_ok=chain_ok, matched=matched,
                                              sample_slots=sample_slots)


def spec_shift_rows(positions: torch.Tensor, input_ids: torch.Tensor, seq_lens: torch.Tensor,
                    page_table: torch.Tensor, query_start_loc: torch.Tensor, deferred_mask: torch.Tensor,
                    deferred_src: torch.Tensor, prev_rejected: torch.Tensor, prev_sampled: torch.Tensor, *,
                    page_size: int, max_query_len: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Provisional rows moved down by what the in-flight step rejected, in one pass (spec/shift_rows).

    A row b whose first input is deferred (deferred_mask [T] bool at query_start_loc[b]) takes
    shift s = prev_rejected[src] (src = deferred_src [T] int64 there, the in-flight sample it
    planned to read): its positions and seq_len move down by s, its KV slots follow the moved
    positions through page_table [B, P] int32 (page_size tokens a page), and its first input
    becomes prev_sampled[src - s] (written into input_ids [T] int64 in place). Other rows keep
    their positions (their slots are recomputed the same). positions [T] int64, seq_lens [B] int32,
    query_start_loc [B+1] int32; max_query_len: a host bound of the rows' tokens.
    Returns new (positions int64 [T], slot_mapping int64 [T], seq_lens int32 [B], shift int64 [B]).
    """
    return impl_for("spec", "shift_rows", positions)(positions, input_ids, seq_lens, page_table, query_start_loc,
                                                     deferred_mask, deferred_src, prev_rejected, prev_sampled,
                                                     page_size=page_size, max_query_len=max_query_len)


def spec_fill_drafts(input_ids: torch.Tensor, query_start_loc: torch.Tensor, drafts: torch.Tensor,
                     sample_slots: torch.Tensor, *, num_decodes: int, max_query_len: int) -> None:
    """Device drafts into the decode rows' draft slots, in place (spec/fill_drafts).

    input_ids [T] int64; decode row b (b < num_decodes, inputs query_start_loc[b]..[b+1], int32
    [B+1]) gets input 1 + m = drafts[slot, m] for each of its draft slots m, where drafts is
    [N, k] int64 per slot and slot = sample_slots[query_start_loc[b]] (int64 [S]: decode rows
    sample every input, first). max_query_len: a host bound of the decode rows' tokens (<= k + 1).
    """
    impl_for("spec", "fill_drafts", input_ids)(input_ids, query_start_loc, drafts, sample_slots,
                                               num_decodes=num_decodes, max_query_len=max_query_len)
