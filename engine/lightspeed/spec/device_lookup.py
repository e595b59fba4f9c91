"""Prompt lookup on the device ("ngram_gpu", as vLLM spells it): n-gram drafts that keep overlap.

Why. The host n-gram / suffix proposer needs each step's accepted tokens on the host before it can
draft the next step, so the engine steps one at a time with it; drafting behind a step in flight
collapses acceptance (model_runner.needs_host_tokens). This drafter keeps every request's tokens on
the device and drafts right after verification, in the same launch, like the model drafters: the
drafts continue the true accepted tokens, so the overlapped loop keeps running and no chain check
is needed (spec/inputs.py).

How. `history[slot]` holds the request's prompt and accepted outputs (int32, one row per slot,
written at bind and after each step's verification, `lightspeed_kernel.ops.ngram_record`: one
launch); `lengths[slot]` how many are known. After a step, for each request it sampled: the longest tail of its tokens (prompt_lookup_min..max long)
that also occurs earlier, latest occurrence on a tie; the k tokens after that occurrence are the
drafts (`lightspeed_kernel.ops.ngram_lookup`: one Triton launch on GPU, one program per row
scanning its tokens; O(rows * tokens * prompt_lookup_max) device work, no host sync).

Draft counts. The scheduler plans each step's drafts per slot before the previous step has
reported, so a row carries k draft slots whenever its request's latest known search found a match
(the host learns of it with the step's tokens, a step or two late). Draft slots without a match
carry token 0: verification rejects or accepts them like any other draft, so outputs never change;
only matched drafts count in the metrics (`valid`).
"""

from __future__ import annotations

import numpy as np
import torch
from lightspeed_kernel import ops

from ..runner.inputs import StepTensors, upload
from .config import SpeculativeConfig
from .inputs import max_row_tokens


def history_bytes(max_num_seqs: int, max_model_len: int, k: int) -> int:
    """Device bytes of the token history (the factory keeps them out of the KV budget)."""
    return max_num_seqs * (max_model_len + k + 2) * 4


class DeviceLookupDrafter:
    """The "ngram_gpu" drafter: prompt lookup over each request's own tokens, on the device."""

    on_device = True
    needs_hidden = False
    lookahead = 0  # drafts write no KV of their own

    def __init__(self, config: SpeculativeConfig, *, max_num_seqs: int, max_model_len: int, device: torch.device):
        self.k, self.n_min, self.n_max = config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max
        self.device = device
        n = max_num_seqs
        # Room past max_model_len: a row's rejected samples are written past its known tokens.
        self.width = max_model_len + self.k + 2
        self.history = torch.zeros(n, self.width, dtype=torch.int32, device=device)
        self.lengths = torch.zeros(n, dtype=torch.int64, device=device)
        self.drafts = torch.zeros(n, self.k, dtype=torch.int64, device=device)  # [slots, k], read by the next plan
        self.valid = torch.zeros(n, dtype=torch.int32, device=device)          # matched drafts per slot
        self._row_slots = torch.zeros(n, dtype=torch.int64, device=device)     # a step's searched slots (at most one a slot)
        self.enabled = np.zeros(n, dtype=bool)
        self.matched = np.zeros(n, dtype=bool)   # host: the slot's latest reported search found a match
        self._counts = np.zeros(n, dtype=np.int32)

    # -- requests --------------------------------------------------------------------------------
    def bind(self, slot: int, prompt, outputs, group: int, enabled: bool) -> None:
        tokens = np.asarray([*prompt, *outputs], dtype=np.int32)
        if tokens.shape[0] > self.width:
            raise ValueError(f"{tokens.shape[0]} tokens exceed the draft history ({self.width})")
        self.history[slot, : tokens.shape[0]] = upload(tokens, self.device)
        self.lengths[slot].fill_(tokens.shape[0])  # not `= n`: a 0-dim pageable copy stalls the host
        self.enabled[slot] = enabled
        self.matched[slot] = True  # until its first search reports: draft

    def release(self, slot: int) -> None:
        self.enabled[slot] = self.matched[slot] = False

    # -- one step ----------------------------------------------------------------------------------
    def plan_args(self) -> dict:
        np.multiply(self.enabled & self.matched, self.k, out=self._counts, casting="unsafe")
        return {"num_draft_tokens": self._counts}

    def run(self, plan, t: StepTensors, tokens: torch.Tensor, accepted: torch.Tensor | None,
            keep: torch.Tensor | None, hidden: torch.Tensor | None = None) -> torch.Tensor | None:
        """Record the step's kept tokens, then draft for every request it sampled. Returns the
        matched draft count per sampling row (int32 [R], on the device; None: nothing sampled);
        rows are the decode rows, then the sampled prompts, as `sampling_rows(plan)`."""
        num_samples = plan.sample_batch_rows.shape[0]
        if num_samples == 0:
            return None
        nd = int(plan.num_decodes)
        qsl = plan.query_start_loc
        rows = sampling_rows(plan)
        # Two launches: the kept tokens into the history (which also lists the rows' slots for the
        # search: no upload), then the search, into drafts / valid.
        row_slots = self._row_slots[: rows.shape[0]]  # reused: the stream orders it after the last search
        ops.ngram_record(self.history, self.lengths, tokens, t.positions, t.logits_indices, t.sample_slots,
                         t.query_start_loc, num_decodes=nd, num_decode_tokens=int(plan.num_decode_tokens),
                         max_query_len=max_row_tokens(qsl[: nd + 1]), keep=keep,
                         out_slots=row_slots)
        # A bound of every row's known tokens, from the host: its KV length after the step, plus
        # the bonus token (a provisional row's planned length is never below its true one).
        width = int(min(self.width, int(plan.seq_lens[rows].max()) + 1))
        _, valid = ops.ngram_lookup(self.history, row_slots, self.lengths, k=self.k, n_min=self.n_min,
                                    n_max=self.n_max, max_len=width, out_drafts=self.drafts, out_valid=self.valid)
        return valid

    def observe(self, slots: np.ndarray, valid: np.ndarray) -> None:
        """A step's search results reached the host: slots whose search found no match stop
        drafting until one does (their drafts would be token 0, verified for nothing)."""
        live = self.enabled[slots]
        self.matched[slots[live]] = valid[live] > 0


def sampling_rows(plan) -> np.ndarray:
    """Row of each request the plan samples: every decode row, then the prompts that complete."""
    nd, ndt = int(plan.num_decodes), int(plan.num_decode_tokens)
    return np.concatenate([np.arange(nd, dtype=np.int64), plan.sample_batch_rows[ndt:].astype(np.int64)])

