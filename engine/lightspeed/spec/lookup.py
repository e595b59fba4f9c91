"""The CPU drafters ("ngram", "suffix"): lightspeed_scheduler.DraftProposer behind the runner.

Per step, before the plan: every bound slot asks the proposer for a continuation of its tokens.
A slot whose row of the in-flight step has not reported yet gets one token more, the first being
its guess of that row's last sample, and the in-flight row's drafts count as part of its context
(spec/inputs.py checks the guess on the device). After a step is collected its accepted tokens
are committed and its acceptance observed (the proposer adapts each slot's draft length); a
provisional row that is now known to fail its chain check stops counting as context.
A row drafted behind an in-flight speculative row is only worth it when that row accepts all
its drafts; so a slot chains drafts that way only while its last verified row accepted all of
its drafts (copying), and otherwise drafts every other step (behind a row without drafts, where
only the guess must hold).
All per-slot state lives in numpy arrays indexed by slot: no Python loop over requests.
"""

from __future__ import annotations

import hashlib

import numpy as np

from .config import SpeculativeConfig


def conversation_group(session_id: str | None, prompt: list[int]) -> int:
    """Requests of one conversation share a group: its session id, else its first 128 prompt tokens."""
    key = f"s:{session_id}".encode() if session_id else np.asarray(prompt[:128], np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")


class LookupDrafter:
    on_device = False
    needs_hidden = False
    lookahead = 0

    def __init__(self, config: SpeculativeConfig, max_num_seqs: int):
        from lightspeed_scheduler import DraftProposer

        suffix = config.method == "suffix"
        self.k = k = config.num_speculative_tokens
        self.proposer = DraftProposer(
            method=config.method, max_num_seqs=max_num_seqs, num_speculative_tokens=k,
            min_match=2 if suffix else config.prompt_lookup_min,
            max_match=config.suffix_decoding_max_tree_depth if suffix else config.prompt_lookup_max,
            max_cached_requests=config.suffix_decoding_max_cached_requests,
            max_spec_factor=config.suffix_decoding_max_spec_factor,
            min_token_prob=config.suffix_decoding_min_token_prob)
        n = max_num_seqs
        self.bound = np.zeros(n, dtype=bool)
        self.enabled = np.zeros(n, dtype=bool)
        # This step's proposals, by slot (read by the scheduler and the chain check).
        self.counts = np.zeros(n, dtype=np.int32)
        self.tokens = np.zeros((n, k), dtype=np.int32)
        self.guess = np.full(n, -1, dtype=np.int64)
        # The latest launched plan: what its rows drafted, until it is collected.
        self._latest_step, self._collected_step = -1, -1
        self._sampled = np.zeros(n, dtype=np.int32)
        self._pending_counts = np.zeros(n, dtype=np.int32)
        self._pending_tokens = np.zeros((n, k), dtype=np.int32)
        self._pending_guess = np.full(n, -1, dtype=np.int64)
        self._all_accepted = np.zeros(n, dtype=bool)  # the slot's last verified drafts were all accepted
        self._out_tokens = np.zeros((n, k + 1), dtype=np.int32)
        self._out_counts = np.zeros(n, dtype=np.int32)

    def bind(self, slot: int, prompt: list[int], outputs: list[int], group: int, enabled: bool) -> None:
        self.proposer.start(slot, [*prompt, *outputs], len(prompt), group)
        self.bound[slot], self.enabled[slot] = True, enabled

    def release(self, slot: int) -> None:
        self.proposer.release(slot)
        self.bound[slot] = self.enabled[slot] = False

    def propose(self) -> None:
        """Fill counts / tokens / guess for every bound slot."""
        self.counts[:] = 0
        self.guess[:] = -1
        slots = np.nonzero(self.bound & self.enabled)[0].astype(np.int32)
        if slots.size == 0:
            return
        live = self._latest_step > self._collected_step
        extra = self._sampled[slots] if live else np.zeros(slots.size, np.int32)
        pending = self._pending_counts[slots] if live else np.zeros(slots.size, np.int32)
        m = slots.size
        out, out_counts = self._out_tokens[:m], self._out_counts[:m]
        self.proposer.propose(slots, extra, pending, self._pending_tokens[slots], out, out_counts)
        guessed = extra > 0
        counts = np.where(guessed, np.maximum(out_counts - 1, 0), out_counts)
        # Behind an in-flight speculative row, drafts pay only if it accepts everything.
        counts[(pending > 0) & ~self._all_accepted[slots]] = 0
        self.counts[slots] = counts
        self.guess[slots] = np.where(guessed & (out_counts > 0), out[:, 0], -1)
        self.tokens[slots] = np.where(guessed[:, None], out[:, 1:], out[:, :-1])

    def plan_args(self) -> dict:
        self.propose()
        return {"num_draft_tokens": self.counts, "draft_token_ids": self.tokens}

    def record_plan(self, plan, row_drafts: np.ndarray, deferred: np.ndarray) -> np.ndarray:
        """Remember what the plan's rows drafted; returns the guess per row (-1: none)."""
        nd = row_drafts.shape[0]
        slots = plan.req_slots
        dec = slots[:nd]
        self._latest_step = int(plan.step_id)
        self._sampled[:] = 0
        self._sampled[slots[plan.sample_batch_rows]] = 1
        self._pending_counts[:] = 0
        self._pending_counts[dec] = row_drafts
        self._pending_tokens[dec] = self.tokens[dec]
        guess_by_row = np.full(slots.shape[0], -1, dtype=np.int64)
        with_guess = deferred[:nd] & (row_drafts > 0)
        guess_by_row[:nd] = np.where(with_guess, self.guess[dec], -1)
        self._pending_guess[:] = -1
        self._pending_guess[dec] = guess_by_row[:nd]
        return guess_by_row

    def collect(self, step_id: int, commit_slots: np.ndarray, commit_tokens: np.ndarray, decode_slots: np.ndarray,
                drafted: np.ndarray, accepted_drafts: np.ndarray, row_slots: np.ndarray, row_partial: np.ndarray,
                row_last: np.ndarray) -> None:
        """A step's verified result: commit its kept tokens (in order), observe its acceptance
        (drafted 0 where a chain check failed: no signal), and void stale chains of the in-flight
        plan. row_*: per sampling row, its slot, whether drafts were rejected, its last kept token."""
        self.proposer.commit(commit_slots, commit_tokens)
        self.proposer.observe(decode_slots, drafted, accepted_drafts)
        verified = drafted > 0
        self._all_accepted[decode_slots[verified]] = accepted_drafts[verified] >= drafted[verified]
        self._collected_step = max(self._collected_step, step_id)
        if self._latest_step != step_id + 1:
            return
        # The in-flight plan's rows were drafted assuming this step accepted everything and ended
        # on their guess: where it did not, they keep one token, so their drafts are no context.
        guess = self._pending_guess[row_slots]
        stale = (self._sampled[row_slots] > 0) & (row_partial | ((guess >= 0) & (guess != row_last)))
        self._pending_counts[row_slots[stale]] = 0
