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


@triton.jit(do_not_specialize=["k"])
def _ngram_lookup_kernel(history_ptr, rows_ptr, lengths_ptr, drafts_ptr, valid_ptr, out_drafts_ptr, out_valid_ptr,
                         stride_h, k, N_MIN: tl.constexpr, N_MAX: tl.constexpr, BLOCK: tl.constexpr,
                         K_PAD: tl.constexpr, OUT: tl.constexpr):
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
    if OUT:  # the same, at the drafted row's own entry
        tl.store(out_drafts_ptr + row * k + m, draft.to(tl.int64), mask=m < k)
        tl.store(out_valid_ptr + row, tl.sum(known.to(tl.int32), axis=0))


@register("spec", "ngram_lookup", "triton_ngram_lookup", (torch.int32,))
def ngram_lookup(history: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, *, k: int, n_min: int,
                 n_max: int, max_len: int, out_drafts: torch.Tensor | None = None,
                 out_valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """history [N, W] int32 (last dim contiguous), rows [R] int64, lengths [N] -> (drafts [R, k], valid [R])."""
    check(history.dim() == 2 and history.stride(1) == 1, "history must be [N, W] with contiguous rows")
    check((out_drafts is None) == (out_valid is None), "out_drafts and out_valid go together")
    check(out_drafts is None or (out_drafts.shape[1:] == (k,) and out_drafts.is_contiguous()
                                 and out_drafts.dtype == torch.int64 and out_valid.dtype == torch.int32),
          "out_drafts must be a contiguous int64 [N, k], out_valid int32 [N]")
    check(1 <= n_min <= n_max and k >= 1, f"need 1 <= n_min <= n_max and k >= 1, got {n_min}, {n_max}, {k}")
    num = rows.shape[0]
    drafts = torch.empty((num, k), dtype=torch.int64, device=history.device)
    valid = torch.empty(num, dtype=torch.int32, device=history.device)
    if num == 0:
        return drafts, valid
    block = min(1024, max(16, next_pow2(max_len)))
    out = out_drafts is not None
    _ngram_lookup_kernel[(num,)](history, rows, lengths, drafts, valid, out_drafts if out else drafts,
                                 out_valid if out else valid, history.stride(0), k, N_MIN=n_min, N_MAX=n_max,
                                 BLOCK=block, K_PAD=next_pow2(k), OUT=out, num_warps=4)
    return drafts, valid


# -- verification, provisional-row shifts, device drafts ----------------------------------------------
# Each replaces a chain of ten to twenty small torch ops on the speculative step path (every one a
# host-side dispatch and a launch: for a small model the host, not the GPU, sets the step time) by
# one launch with one program per row; none reads anything back to the host.


# Counts that change from step to step (rows, samples, tokens, the page-table width) are not
# specialised on (==1, %16): each new combination would compile another variant in the middle of
# serving (the H200's py-spy of a c = 16 ngram_gpu run had 24% of the engine core in Triton compiles).
@triton.jit(do_not_specialize=["num_decodes", "num_samples", "num_inputs"])
def _verify_kernel(tokens_ptr, input_ids_ptr, qsl_ptr, chain_ptr, matched_ptr, slots_ptr, verdict_ptr, keep_ptr,
                   rejected_ptr, num_decodes, num_samples, num_inputs, HAS_CHAIN: tl.constexpr,
                   HAS_MATCHED: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK).to(tl.int64)
    if b == num_decodes:  # the last program: prefill samples keep their token and reject nothing
        for start in range(tl.load(qsl_ptr + num_decodes).to(tl.int64), num_samples, BLOCK):
            i = start + j
            tl.store(keep_ptr + i, (i * 0 + 1).to(tl.int8), mask=i < num_samples)
            tl.store(rejected_ptr + i, i * 0, mask=i < num_samples)
    else:
        start = tl.load(qsl_ptr + b).to(tl.int64)
        n = tl.load(qsl_ptr + b + 1).to(tl.int64) - start
        tok = tl.load(tokens_ptr + start + j, mask=j < n, other=0)
        nxt_ok = (j < n - 1) & (start + j + 1 < num_inputs)
        nxt = tl.load(input_ids_ptr + start + j + 1, mask=nxt_ok, other=0)
        # Leading matches = position of the first miss (the row's last position always misses).
        miss = tl.where((j < n) & ~(nxt_ok & (tok == nxt)), j, 1 << 20)
        lead = tl.min(miss, axis=0)
        ok = tl.full((), 1, tl.int64)
        if HAS_CHAIN:
            ok = tl.load(chain_ptr + b).to(tl.int64)
            lead = lead * ok
        accepted = lead + 1
        tl.store(keep_ptr + start + j, (j < accepted).to(tl.int8), mask=j < n)
        tl.store(rejected_ptr + start + j, j * 0 + n - accepted, mask=j < n)
        tl.store(verdict_ptr + b, accepted)
        tl.store(verdict_ptr + num_decodes + b, ok)
        if HAS_MATCHED:
            slot = tl.load(slots_ptr + start)
            tl.store(verdict_ptr + 2 * num_decodes + b, tl.load(matched_ptr + slot).to(tl.int64))


@register("spec", "verify", "triton_spec_verify", (torch.int64,))
def spec_verify(tokens: torch.Tensor, input_ids: torch.Tensor, query_start_loc: torch.Tensor, *, num_decodes: int,
                max_query_len: int, chain_ok: torch.Tensor | None = None, matched: torch.Tensor | None = None,
                sample_slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [S] int64, input_ids [T] int64, query_start_loc [B+1] int32 -> (verdict, keep, rejected)."""
    check(matched is None or sample_slots is not None, "matched needs sample_slots")
    check(tokens.is_contiguous() and input_ids.is_contiguous(), "tokens and input_ids must be contiguous")
    num = tokens.shape[0]
    verdict = torch.empty((3 if matched is not None else 2, num_decodes), dtype=torch.int64, device=tokens.device)
    keep = torch.empty(num, dtype=torch.bool, device=tokens.device)
    rejected = torch.empty(num, dtype=torch.int64, device=tokens.device)
    chain = chain_ok.view(torch.int8) if chain_ok is not None else tokens
    _verify_kernel[(num_decodes + 1,)](tokens, input_ids, query_start_loc, chain,
                                       matched if matched is not None else tokens,
                                       sample_slots if sample_slots is not None else tokens, verdict,
                                       keep.view(torch.int8), rejected, num_decodes, num, input_ids.shape[0],
                                       HAS_CHAIN=chain_ok is not None, HAS_MATCHED=matched is not None,
                                       BLOCK=max(16, next_pow2(max_query_len)), num_warps=1)
    return verdict, keep, rejected


@triton.jit(do_not_specialize=["stride_page"])
def _shift_rows_kernel(positions_ptr, input_ids_ptr, seq_lens_ptr, page_table_ptr, qsl_ptr, mask_ptr, src_ptr,
                       prev_rejected_ptr, prev_sampled_ptr, out_positions_ptr, out_slots_ptr, out_seq_lens_ptr,
                       shift_ptr, stride_page, page_size, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(qsl_ptr + b).to(tl.int64)
    n = tl.load(qsl_ptr + b + 1).to(tl.int64) - start
    j = tl.arange(0, BLOCK).to(tl.int64)
    first = (j == 0) & (j < n)  # the row's first input, if it has one
    # Vector loads of the row's first input (the interpreter rejects scalar masks).
    deferred = tl.load(mask_ptr + start + j * 0, mask=first, other=0) != 0
    src = tl.load(src_ptr + start + j * 0, mask=first & deferred, other=0)
    shift_v = tl.load(prev_rejected_ptr + src, mask=first & deferred, other=0)
    shift = tl.sum(shift_v, axis=0)
    bonus = tl.load(prev_sampled_ptr + src - shift, mask=first & deferred, other=0)
    tl.store(input_ids_ptr + start + j, bonus, mask=first & deferred)
    tl.store(shift_ptr + b, shift)
    tl.store(out_seq_lens_ptr + b, (tl.load(seq_lens_ptr + b) - shift).to(tl.int32))
    for off in range(0, n, BLOCK):
        i = off + j
        live = i < n
        pos = tl.load(positions_ptr + start + i, mask=live, other=0) - shift
        page = tl.load(page_table_ptr + b * stride_page + pos // page_size, mask=live, other=0).to(tl.int64)
        tl.store(out_positions_ptr + start + i, pos, mask=live)
        tl.store(out_slots_ptr + start + i, page * page_size + pos % page_size, mask=live)


# Inputs per loop trip of the shift: one fixed block (rows loop over longer prefills), so the step's
# longest row never selects a new variant.
SHIFT_BLOCK = 64


@register("spec", "shift_rows", "triton_spec_shift_rows", (torch.int64,))
def spec_shift_rows(positions: torch.Tensor, input_ids: torch.Tensor, seq_lens: torch.Tensor,
                    page_table: torch.Tensor, query_start_loc: torch.Tensor, deferred_mask: torch.Tensor,
                    deferred_src: torch.Tensor, prev_rejected: torch.Tensor, prev_sampled: torch.Tensor, *,
                    page_size: int, max_query_len: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """positions [T] int64, page_table [B, P] int32 (rows contiguous) -> (positions, slots, seq_lens, shift)."""
    rows = query_start_loc.shape[0] - 1
    check(page_table.dim() == 2 and (page_table.stride(1) == 1 or page_table.shape[1] <= 1 or rows == 0),
          "page_table must be [B, P] with contiguous rows")
    check(deferred_src.dtype == torch.int64 and prev_rejected.dtype == torch.int64, "sources must be int64")
    out_positions = torch.empty_like(positions)
    slots = torch.empty_like(positions)
    out_seq_lens = torch.empty_like(seq_lens)
    shift = torch.empty(rows, dtype=torch.int64, device=positions.device)
    if rows == 0:
        return out_positions, slots, out_seq_lens, shift
    _shift_rows_kernel[(rows,)](positions, input_ids, seq_lens, page_table, query_start_loc,
                                deferred_mask.view(torch.int8), deferred_src, prev_rejected, prev_sampled,
                                out_positions, slots, out_seq_lens, shift, page_table.stride(0), page_size,
                                BLOCK=SHIFT_BLOCK, num_warps=1)
    return out_positions, slots, out_seq_lens, shift


@triton.jit
def _fill_drafts_kernel(input_ids_ptr, qsl_ptr, drafts_ptr, slots_ptr, k, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    start = tl.load(qsl_ptr + b).to(tl.int64)
    n = tl.load(qsl_ptr + b + 1).to(tl.int64) - start
    m = tl.arange(0, BLOCK).to(tl.int64)
    live = (m < n - 1) & (m < k)
    slot = tl.load(slots_ptr + start + m * 0, mask=live, other=0)
    draft = tl.load(drafts_ptr + slot * k + m, mask=live, other=0)
    tl.store(input_ids_ptr + start + 1 + m, draft, mask=live)


@register("spec", "fill_drafts", "triton_spec_fill_drafts", (torch.int64,))
def spec_fill_drafts(input_ids: torch.Tensor, query_start_loc: torch.Tensor, drafts: torch.Tensor,
                     sample_slots: torch.Tensor, *, num_decodes: int, max_query_len: int) -> None:
    """input_ids [T] int64 (written in place), drafts [N, k] int64 contiguous."""
    check(drafts.dim() == 2 and drafts.is_contiguous() and drafts.dtype == input_ids.dtype,
          "drafts must be a contiguous [N, k] tensor of input_ids' dtype")
    if num_decodes == 0:
        return
    _fill_drafts_kernel[(num_decodes,)](input_ids, query_start_loc, drafts, sample_slots, drafts.shape[1],
                                        BLOCK=max(16, next_pow2(max_query_len)), num_warps=1)


@triton.jit(do_not_specialize=["num_decodes", "num_decode_tokens"])
def _ngram_record_kernel(history_ptr, lengths_ptr, tokens_ptr, positions_ptr, logits_ptr, slots_ptr, qsl_ptr,
                         keep_ptr, out_slots_ptr, stride_h, width, num_decodes, num_decode_tokens,
                         HAS_KEEP: tl.constexpr, OUT_SLOTS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    j = tl.arange(0, BLOCK).to(tl.int64)
    if r < num_decodes:  # a decode row owns its samples, one per input
        start = tl.load(qsl_ptr + r).to(tl.int64)
        n = tl.load(qsl_ptr + r + 1).to(tl.int64) - start
    else:  # each later sample is a row of its own
        start = (num_decode_tokens + r - num_decodes).to(tl.int64)
        n = tl.full((), 1, tl.int64)
    live = j < n
    i = start + j
    slot = tl.load(slots_ptr + i, mask=live, other=0)
    at = tl.load(positions_ptr + tl.load(logits_ptr + i, mask=live, other=0), mask=live, other=0) + 1
    token = tl.load(tokens_ptr + i, mask=live, other=0)
    tl.store(history_ptr + slot * stride_h + tl.minimum(at, width - 1), token.to(tl.int32), mask=live)
    end = at + 1
    if HAS_KEEP:
        end = tl.where(tl.load(keep_ptr + i, mask=live, other=0) != 0, end, 0)
    end = tl.where(live, end, 0)
    # Every sample of the row has its slot; the max over the row is its last kept sample's end.
    tl.store(lengths_ptr + slot, end * 0 + tl.max(end, axis=0), mask=j == 0)
    if OUT_SLOTS:
        tl.store(out_slots_ptr + r + j, slot, mask=j == 0)


@register("spec", "ngram_record", "triton_ngram_record", (torch.int32,))
def ngram_record(history: torch.Tensor, lengths: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_indices: torch.Tensor, sample_slots: torch.Tensor, query_start_loc: torch.Tensor, *,
                 num_decodes: int, num_decode_tokens: int, max_query_len: int,
                 keep: torch.Tensor | None = None, out_slots: torch.Tensor | None = None) -> None:
    """history [N, W] int32 (rows contiguous), lengths [N] int64; written in place."""
    check(history.dim() == 2 and history.stride(1) == 1, "history must be [N, W] with contiguous rows")
    check(lengths.dtype == torch.int64, "lengths must be int64")
    rows = num_decodes + tokens.shape[0] - num_decode_tokens
    if rows == 0:
        return
    _ngram_record_kernel[(rows,)](history, lengths, tokens, positions, logits_indices, sample_slots,
                                  query_start_loc, keep.view(torch.int8) if keep is not None else tokens,
                                  out_slots if out_slots is not None else tokens, history.stride(0),
                                  history.shape[1], num_decodes, num_decode_tokens, HAS_KEEP=keep is not None,
                                  OUT_SLOTS=out_slots is not None, BLOCK=max(16, next_pow2(max_query_len)),
                                  num_warps=1)
