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

from ..runner.inputs import upload


@dataclass
class SpecStep:
    """Per-step layout of the speculative rows, built on the host from the plan's arrays."""

    num_decodes: int
    num_decode_tokens: int
    row_drafts: np.ndarray          # int32 [num_decodes]: draft tokens per decode row
    h_sample_pos: np.ndarray        # int64 [S]: each sample's position within its row (prefill: 0)
    sample_pos: torch.Tensor        # the same on the device
    decode_rows: torch.Tensor       # int64 [num_decode_tokens]: decode row of each decode sample
    has_draft_next: torch.Tensor    # bool [num_decode_tokens]: a draft follows this position
    chain_ok: torch.Tensor | None = None  # bool [num_decodes]: the row's drafts continue its true input
    has_drafts: bool = False
    dev_row_drafts: torch.Tensor | None = None  # int64 [num_decodes]: row_drafts on the device

    @classmethod
    def build(cls, plan, device: torch.device) -> SpecStep:
        nd, ndt = int(plan.num_decodes), int(plan.num_decode_tokens)
        qsl = plan.query_start_loc
        row_tokens = np.diff(qsl[: nd + 1]).astype(np.int32)
        row_drafts = np.maximum(row_tokens - 1, 0)
        rows = np.repeat(np.arange(nd, dtype=np.int64), row_tokens)
        pos = np.arange(ndt, dtype=np.int64) - qsl[:nd].astype(np.int64)[rows]
        h_sample_pos = np.zeros(int(plan.num_samples), dtype=np.int64)
        h_sample_pos[:ndt] = pos  # decode rows sample every token, in order, first in the plan
        has_next = pos < row_drafts[rows]
        packed = upload(np.concatenate([h_sample_pos, rows, has_next.astype(np.int64), row_drafts.astype(np.int64)]),
                        device)
        s = h_sample_pos.shape[0]
        return cls(nd, ndt, row_drafts, h_sample_pos, packed[:s], packed[s:s + ndt], packed[s + ndt:s + 2 * ndt].bool(),
                   has_drafts=bool(row_drafts.any()), dev_row_drafts=packed[s + 2 * ndt:])

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
        is kept (bool [S]); `tokens` [S] are the target's samples, `input_ids` [T] the step's inputs."""
        nd, ndt = self.num_decodes, self.num_decode_tokens
        # The draft after position j of a row is the row's input j + 1.
        following = input_ids[1:ndt + 1] if input_ids.shape[0] > ndt else torch.cat(
            [input_ids[1:ndt], input_ids.new_full((1,), -1)])
        match = (tokens[:ndt] == following) & self.has_draft_next
        # Leading matches per row = position of its first miss (a row's last position always misses).
        miss_pos = torch.where(match, torch.full_like(self.sample_pos[:ndt], 1 << 20), self.sample_pos[:ndt])
        lead = torch.full((nd,), 1 << 20, dtype=torch.int64, device=tokens.device)
        lead.scatter_reduce_(0, self.decode_rows, miss_pos, reduce="amin")
        if self.chain_ok is not None:
            lead = torch.where(self.chain_ok, lead, torch.zeros_like(lead))
        accepted = lead + 1
        keep = torch.ones_like(tokens, dtype=torch.bool)
        keep[:ndt] = self.sample_pos[:ndt] < accepted[self.decode_rows]
        return accepted, keep

    def rejected_by_sample(self, accepted: torch.Tensor, num_samples: int) -> torch.Tensor:
        """int64 [S]: for each sample, the drafts its row rejected (0 for prefill samples): what the
        next plan's provisional row of that request moves down by."""
        rejected = torch.zeros(num_samples, dtype=torch.int64, device=accepted.device)
        rejected[: self.num_decode_tokens] = (self.dev_row_drafts + 1 - accepted)[self.decode_rows]
        return rejected

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
