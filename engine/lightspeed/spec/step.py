"""One speculative step on the device: where the drafts are, how they are verified.

Design note (lossless verification). A decode row with k drafts d_1..d_k feeds [x, d_1, .., d_k]
and samples every position: t_j is the target's token after the row's first j + 1 inputs, drawn
with the request's own sampling transforms and its RNG counter at (tokens so far + j). The row
keeps t_0..t_a-1 where a - 1 is the number of leading drafts equal to the target's token
(t_j == d_{j+1}). With greedy requests that is the longest matching prefix. With sampled requests
it is rejection sampling for a proposal that puts all its mass on d_{j+1}: the Gumbel race that
draws t_j picks d_{j+1} with probability exactly p(d_{j+1}) (accept), and otherwise a token
distributed as p restricted to the others, renormalised (the residual). Because t_j is the very
draw the non-speculative engine makes at that position (same logits, same transforms, same RNG
counter), outputs are not just distributed as without speculation: for a fixed seed they are the
same tokens. Penalties see the drafts before a position as generated; min_tokens counts them.
Every drafter here proposes tokens, not distributions, so this covers them all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from lightspeed_kernel import ops

from ..runner.inputs import upload


@dataclass
class SpecStep:
    """Per-step layout of the speculative rows, built on the host from the plan's arrays."""

    num_decodes: int
    num_decode_tokens: int
    row_drafts: np.ndarray          # int32 [num_decodes]: draft tokens per decode row
    h_sample_pos: np.ndarray        # int64 [S]: each sample's position within its row (prefill: 0)
    sample_pos: torch.Tensor        # the same on the device
    query_start_loc: torch.Tensor   # int32 [B+1] on the device (the step's)
    chain_ok: torch.Tensor | None = None  # bool [num_decodes]: the row's drafts continue its true input
    has_drafts: bool = False
    matched_by_slot: torch.Tensor | None = None  # int32 [slots]: drafts that came from a match (a
    sample_slots: torch.Tensor | None = None     # drafter that reports them), read at each decode row's slot
    verdict: torch.Tensor | None = None    # after verify: int64 [2 or 3, num_decodes] (ops.spec_verify)
    rejected: torch.Tensor | None = None   # after verify: int64 [S], drafts each sample's row rejected

    @classmethod
    def build(cls, plan, device: torch.device, query_start_loc: torch.Tensor | None = None) -> SpecStep:
        """The step's layout; `query_start_loc`: the plan's on the device (uploaded when None)."""
        nd, ndt = int(plan.num_decodes), int(plan.num_decode_tokens)
        qsl = plan.query_start_loc
        row_tokens = np.diff(qsl[: nd + 1]).astype(np.int32)
        row_drafts = np.maximum(row_tokens - 1, 0)
        rows = np.repeat(np.arange(nd, dtype=np.int64), row_tokens)
        h_sample_pos = np.zeros(int(plan.num_samples), dtype=np.int64)
        h_sample_pos[:ndt] = np.arange(ndt, dtype=np.int64) - qsl[:nd].astype(np.int64)[rows]
        # One upload (each is a pinned copy and a launch): the samples' positions [, query_start_loc].
        s = h_sample_pos.shape[0]
        parts = [h_sample_pos]
        if query_start_loc is None:
            parts.append(qsl.astype(np.int64))
        packed = upload(np.concatenate(parts), device)
        if query_start_loc is None:
            query_start_loc = packed[packed.shape[0] - qsl.shape[0]:].to(torch.int32)
        return cls(nd, ndt, row_drafts, h_sample_pos, packed[:s], query_start_loc, has_drafts=bool(row_drafts.any()))

    def draft_prefix_pairs(self, plan) -> tuple[np.ndarray, np.ndarray]:
        """(sample index, input token index) for every draft before each decode sample: penalties
        at position j of a row count its drafts d_1..d_j as generated."""
        ndt = self.num_decode_tokens
        pos = self.h_sample_pos[:ndt]
        starts = plan.query_start_loc[: self.num_decodes].astype(np.int64)
        row_start = np.repeat(starts, np.diff(plan.query_start_loc[: self.num_decodes + 1]))
        samples = np.repeat(np.arange(ndt, dtype=np.int64), pos)
        first = np.repeat(np.cumsum(pos) - pos, pos)
        offset = np.arange(samples.shape[0], dtype=np.int64) - first + 1  # 1..j for the sample at j
        return samples, np.repeat(row_start, pos) + offset

    def verify(self, tokens: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Accepted tokens per decode row (int64 [num_decodes], 1..k+1) and, per sample, whether it
        is kept (bool [S]); `tokens` [S] are the target's samples, `input_ids` [T] the step's inputs.
        One launch (ops.spec_verify), which also leaves `verdict` and `rejected` for after the step."""
        max_query_len = int(self.row_drafts.max()) + 1 if self.num_decodes else 1
        self.verdict, keep, self.rejected = ops.spec_verify(
            tokens, input_ids, self.query_start_loc, num_decodes=self.num_decodes, max_query_len=max_query_len,
            chain_ok=self.chain_ok, matched=self.matched_by_slot, sample_slots=self.sample_slots)
        return self.verdict[0], keep

    def rejected_by_sample(self, accepted: torch.Tensor, num_samples: int) -> torch.Tensor:
        """int64 [S]: for each sample, the drafts its row rejected (0 for prefill samples): what the
        next plan's provisional row of that request moves down by (computed by `verify`)."""
        assert self.rejected is not None and self.rejected.shape[0] == num_samples, "verify first"
        return self.rejected

    def draft_counts(self, plan, input_ids: torch.Tensor, num_samples: int, vocab_size: int) -> torch.Tensor:
        """int32 [S, V]: how often each token occurs among the drafts before each sample."""
        samples, token_index = self.draft_prefix_pairs(plan)
        counts = torch.zeros(num_samples, vocab_size, dtype=torch.int32, device=input_ids.device)
        if samples.size:
            packed = upload(np.concatenate([samples, token_index]), input_ids.device)
            ids = input_ids[packed[samples.shape[0]:]].long()
            counts.index_put_((packed[: samples.shape[0]], ids), torch.ones_like(ids, dtype=torch.int32),
                              accumulate=True)
        return counts
