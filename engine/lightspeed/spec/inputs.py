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
from lightspeed_kernel import ops

from ..runner.inputs import StepTensors, upload


def deferred_rows(plan) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose first input is the in-flight plan's sample, and that sample's (planned) index."""
    first = plan.query_start_loc[:-1]
    rows = np.nonzero(plan.deferred_input_mask[first])[0] if first.size else np.zeros(0, np.int64)
    return rows, plan.deferred_src_index[first[rows]].astype(np.int64)


def shift_provisional_rows(plan, t: StepTensors, rows: np.ndarray, src: np.ndarray, prev_rejected: torch.Tensor,
                           prev_sampled: torch.Tensor, page_size: int) -> torch.Tensor:
    """Move deferred rows (`rows`, reading in-flight samples `src`: see deferred_rows) down by the
    drafts the in-flight step rejected; returns the shift per row (int64 [B], 0 for rows that are
    not deferred). One launch (`ops.spec_shift_rows`) that reads the deferred inputs the step's
    packet already brought to the device; no upload unless `t` lacks them."""
    mask, dev_src = t.deferred_mask, t.deferred_src
    if mask is None or dev_src is None:
        packed = upload(np.concatenate([plan.deferred_input_mask.astype(np.int64),
                                        np.maximum(plan.deferred_src_index, 0).astype(np.int64)]), t.input_ids.device)
        num_tokens = t.positions.shape[0]
        mask, dev_src = packed[:num_tokens].bool(), packed[num_tokens:]
    t.positions, t.slot_mapping, t.seq_lens, shift = ops.spec_shift_rows(
        t.positions, t.input_ids, t.seq_lens, t.page_table, t.query_start_loc, mask, dev_src, prev_rejected,
        prev_sampled, page_size=page_size, max_query_len=max_row_tokens(plan.query_start_loc))
    return shift


def max_row_tokens(query_start_loc: np.ndarray) -> int:
    """The most tokens any row of `query_start_loc` holds (1 for an empty batch)."""
    return int(np.diff(query_start_loc).max()) if query_start_loc.shape[0] > 1 else 1


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
    """Write `drafts` [slots, k] (from the previous step's model drafter) into the decode rows' draft
    slots: row b's input 1 + m is drafts[req_slots[b], m] (one launch, `ops.spec_fill_drafts`; a
    decode row's slot is its first sample's)."""
    nd = int(plan.num_decodes)
    if nd == 0 or int(plan.num_decode_tokens) == nd:
        return  # no draft slots
    ops.spec_fill_drafts(t.input_ids, t.query_start_loc, drafts, t.sample_slots, num_decodes=nd,
                         max_query_len=max_row_tokens(plan.query_start_loc[: nd + 1]))
