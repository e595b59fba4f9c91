"""Device-side fixes of a plan's inputs for speculative rows (no host sync).

Provisional rows. Under overlap a row planned behind an in-flight speculative row of the same
request assumes that row accepts all its drafts (scheduler/README.md). Once the in-flight step's
verification has run (earlier on the same stream), the rejected count r of that row is on the
device: this row's positions, KV slots and seq_len move down by r and its first input is the
in-flight step's sample at `deferred_src_index - r` (the bonus token, wherever it landed).

Chain check. A CPU drafter proposing for such a row does not know the in-flight tokens yet: it
guesses the row's first input (the continuation it expects) and drafts after that guess. The
drafts are valid only when r = 0 and the first input equals the guess; otherwise the row keeps
just its first sampled token (always correct: it follows the true input).

Device drafts. A model drafter writes drafts for the next step on the device; they are gathered
into the plan's draft slots here.
"""

from __future__ import annotations

import numpy as np
import torch

from ..runner.inputs import StepTensors, upload


def deferred_rows(plan) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose first input is the in-flight plan's sample, and that sample's (planned) index."""
    first = plan.query_start_loc[:-1]
    rows = np.nonzero(plan.deferred_input_mask[first])[0] if first.size else np.zeros(0, np.int64)
    return rows, plan.deferred_src_index[first[rows]].astype(np.int64)


def shift_provisional_rows(plan, t: StepTensors, rows: np.ndarray, src: np.ndarray, prev_rejected: torch.Tensor,
                           prev_sampled: torch.Tensor, page_size: int) -> torch.Tensor:
    """Move deferred rows down by the drafts the in-flight step rejected; returns the shift per
    row (int64 [B], 0 for rows that are not deferred)."""
    device = t.input_ids.device
    num_rows = plan.query_start_loc.shape[0] - 1
    n, num_tokens = rows.shape[0], t.positions.shape[0]
    token_rows = np.repeat(np.arange(num_rows, dtype=np.int64), np.diff(plan.query_start_loc))
    first = plan.query_start_loc[:-1][rows].astype(np.int64)
    # One upload for every host array of the fix-up (each upload is a pinned copy and a launch).
    packed = upload(np.concatenate([rows.astype(np.int64), src, first, token_rows]), device)
    dev_rows, dev_src, dev_first = packed[:n], packed[n:2 * n], packed[2 * n:3 * n]
    dev_token_rows = packed[3 * n:3 * n + num_tokens]
    shift = torch.zeros(num_rows, dtype=torch.int64, device=device)
    shift[dev_rows] = prev_rejected[dev_src]
    positions = t.positions - shift[dev_token_rows]
    pages = t.page_table[dev_token_rows, positions // page_size]
    t.positions = positions
    t.slot_mapping = pages.long() * page_size + positions % page_size
    t.seq_lens = t.seq_lens - shift.to(t.seq_lens.dtype)
    t.input_ids[dev_first] = prev_sampled[dev_src - shift[dev_rows]].to(t.input_ids.dtype)
    return shift


def chain_ok(plan, t: StepTensors, rows: np.ndarray, shift: torch.Tensor | None, guess_by_row: np.ndarray | None,
             num_decodes: int) -> torch.Tensor:
    """bool [num_decodes]: the row's drafts continue its true first input (see the module note)."""
    device = t.input_ids.device
    ok = torch.ones(num_decodes, dtype=torch.bool, device=device)
    decode = rows[rows < num_decodes]
    if decode.size == 0:
        return ok
    dev_rows = upload(decode.astype(np.int64), device)
    good = torch.ones(decode.shape[0], dtype=torch.bool, device=device)
    if shift is not None:
        good &= shift[dev_rows] == 0
    if guess_by_row is not None:
        first = upload(plan.query_start_loc[decode].astype(np.int64), device)
        guess = upload(guess_by_row[decode].astype(np.int64), device)
        good &= t.input_ids[first] == guess
    ok[dev_rows] = good
    return ok


def fill_device_drafts(plan, t: StepTensors, drafts: torch.Tensor) -> None:
    """Write `drafts` [slots, k] (from the previous step's model drafter) into the decode rows'
    draft slots: row b's input 1 + m is drafts[req_slots[b], m]."""
    nd = int(plan.num_decodes)
    qsl = plan.query_start_loc
    row_drafts = np.maximum(np.diff(qsl[: nd + 1]) - 1, 0)
    total = int(row_drafts.sum())
    if total == 0:
        return
    rows = np.repeat(np.arange(nd, dtype=np.int64), row_drafts)
    m = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(row_drafts) - row_drafts, row_drafts)
    target = qsl[:nd].astype(np.int64)[rows] + 1 + m
    flat = plan.req_slots[:nd].astype(np.int64)[rows] * drafts.shape[1] + m
    packed = upload(np.concatenate([target, flat]), t.input_ids.device)
    t.input_ids[packed[:total]] = drafts.reshape(-1)[packed[total:]].to(t.input_ids.dtype)
