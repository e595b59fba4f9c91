"""Per-request sampling state as tensors with one row per scheduler slot (`plan.req_slots`).

Design: a request's parameters are written into row `slot` once, when the request first shows up
in a plan (`bind`); every step then gathers the rows of the sampled positions with one index per
tensor, so sampling a batch costs the same whatever its mix of parameters. Host mirrors (numpy)
of the few flags that choose a code path (greedy? penalties? bias? min_tokens?) let the step skip
work without reading the device.

Every table is allocated at start-up for every slot, so a request can never make the engine
allocate device memory on the step path (an allocation there could fail the whole engine): output
token counts and prompt masks `[slots, V]` for penalties, `[slots, max_logit_bias]` logit-bias
tables, `[slots, max_stop_ids]` ids masked before min_tokens. `table_bytes` is what they cost (the
factory keeps it out of the KV budget); a request that needs wider rows is rejected at admission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from .inputs import upload

if TYPE_CHECKING:  # the runner never needs msgspec at run time (GPU benchmarks drive it directly)
    from ..core.messages import SamplingSpec


_MIX = 0x9E3779B97F4A7C15


def derive_seed(engine_seed: int, req_id: int) -> int:
    """Seed of a request that set none: a fixed function of the engine seed and the request's id."""
    x = (engine_seed * _MIX + req_id * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return x & 0x7FFFFFFFFFFFFFFF


def table_bytes(max_num_seqs: int, vocab_size: int, max_logit_bias: int, max_stop_ids: int) -> int:
    """Device bytes of a SamplingState's tables (penalties, logit bias, stop ids, scalar rows)."""
    return max_num_seqs * (vocab_size * 5 + max_logit_bias * 12 + max_stop_ids * 8 + 64)


class SamplingState:
    """Rows of sampling parameters indexed by slot, on the model's device."""

    def __init__(self, max_num_seqs: int, vocab_size: int, device: torch.device, engine_seed: int = 0, *,
                 max_logit_bias: int = 1024, max_stop_ids: int = 80):
        n, dev = max_num_seqs, device
        self.vocab_size, self.device, self.engine_seed = vocab_size, dev, engine_seed
        self.temperature = torch.zeros(n, dtype=torch.float32, device=dev)
        self.top_k = torch.zeros(n, dtype=torch.int32, device=dev)
        self.top_p = torch.ones(n, dtype=torch.float32, device=dev)
        self.min_p = torch.zeros(n, dtype=torch.float32, device=dev)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=dev)
        self.offsets = torch.zeros(n, dtype=torch.int64, device=dev)  # tokens sampled so far (the RNG counter)
        self._ones_buf = torch.ones(n, dtype=torch.int64, device=dev)  # record()'s weights: no fill kernel a step
        self.presence = torch.zeros(n, dtype=torch.float32, device=dev)
        self.frequency = torch.zeros(n, dtype=torch.float32, device=dev)
        self.repetition = torch.ones(n, dtype=torch.float32, device=dev)
        self.min_tokens = torch.zeros(n, dtype=torch.int64, device=dev)
        # Host mirrors that pick code paths.
        self.h_greedy = np.ones(n, dtype=bool)
        self.h_penalties = np.zeros(n, dtype=bool)
        self.h_bias = np.zeros(n, dtype=bool)
        self.h_min_tokens = np.zeros(n, dtype=np.int64)
        self.h_logprobs = np.full(n, -1, dtype=np.int64)  # top-n asked; -1 = none
        self.h_structured = np.zeros(n, dtype=bool)
        # Pre-sized tables (see the module note).
        self.output_counts = torch.zeros((n, vocab_size), dtype=torch.int32, device=dev)  # penalties
        self.prompt_mask = torch.zeros((n, vocab_size), dtype=torch.bool, device=dev)
        self.bias_ids = torch.zeros((n, max(1, max_logit_bias)), dtype=torch.int64, device=dev)  # pad: token 0
        self.bias_vals = torch.zeros((n, max(1, max_logit_bias)), dtype=torch.float32, device=dev)  # pad: 0
        self.stop_ids = torch.full((n, max(1, max_stop_ids)), -1, dtype=torch.int64, device=dev)  # pad: -1
        self.max_logit_bias, self.max_stop_ids = max_logit_bias, max_stop_ids
        self._bias_width = 1  # widest logit_bias seen: the step gathers only that many columns

    # -- admission (once per request, not on the per-step path) --------------------------------
    def bind(self, slot: int, req_id: int, spec: SamplingSpec, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Write a request's parameters into `slot`; `output_ids` is non-empty when a retracted request returns."""
        num_outputs = len(output_ids)
        # fill_ takes the value as a kernel argument. `table[slot] = x` would copy a 0-dim host tensor
        # from pageable memory, which makes the host wait for the step in flight (on the H200 at 128
        # concurrent that wait was 47% of the engine core's time: every new request stalled a step).
        self.temperature[slot].fill_(spec.temperature)
        self.top_k[slot].fill_(spec.top_k if spec.top_k > 0 else 0)
        self.top_p[slot].fill_(spec.top_p)
        self.min_p[slot].fill_(spec.min_p)
        self.seeds[slot].fill_(spec.seed if spec.seed is not None else derive_seed(self.engine_seed, req_id))
        self.offsets[slot].fill_(num_outputs)
        self.h_greedy[slot] = spec.temperature == 0.0
        self.h_logprobs[slot] = -1 if spec.logprobs is None else spec.logprobs
        self.h_structured[slot] = spec.structured_kind is not None
        self._bind_penalties(slot, spec, prompt_ids, output_ids)
        self._bind_bias(slot, spec.logit_bias)
        self._bind_min_tokens(slot, spec)

    def unbind(self, slot: int) -> None:
        """Make `slot` a plain greedy row (its request failed while binding: the batch still runs it)."""
        self.h_greedy[slot], self.h_penalties[slot], self.h_bias[slot] = True, False, False
        self.h_min_tokens[slot], self.h_logprobs[slot], self.h_structured[slot] = 0, -1, False
        self.temperature[slot].fill_(0.0)

    def _bind_penalties(self, slot: int, spec: SamplingSpec, prompt_ids: list[int], output_ids: list[int]) -> None:
        on = spec.presence_penalty != 0.0 or spec.frequency_penalty != 0.0 or spec.repetition_penalty != 1.0
        self.h_penalties[slot] = on
        self.presence[slot].fill_(spec.presence_penalty)
        self.frequency[slot].fill_(spec.frequency_penalty)
        self.repetition[slot].fill_(spec.repetition_penalty)
        if not on:
            return
        self.output_counts[slot].zero_()
        self.prompt_mask[slot].zero_()
        self.prompt_mask[slot].index_fill_(0, upload(np.asarray(prompt_ids, np.int64), self.device), True)
        if output_ids:
            outs = upload(np.asarray(output_ids, np.int64), self.device)
            self.output_counts[slot].index_add_(0, outs, torch.ones_like(outs, dtype=torch.int32))

    def _bind_bias(self, slot: int, logit_bias: dict[int, float] | None) -> None:
        self.h_bias[slot] = bool(logit_bias)
        if not logit_bias:
            return
        width = len(logit_bias)
        if width > self.max_logit_bias:
            raise ValueError(f"logit_bias has {width} entries; at most max_logit_bias={self.max_logit_bias}")
        self.bias_ids[slot].zero_()
        self.bias_vals[slot].zero_()
        self.bias_ids[slot, :width] = upload(np.fromiter(logit_bias.keys(), np.int64, width), self.device)
        self.bias_vals[slot, :width] = upload(np.fromiter(logit_bias.values(), np.float32, width), self.device)
        self._bias_width = max(self._bias_width, width)

    def _bind_min_tokens(self, slot: int, spec: SamplingSpec) -> None:
        banned = sorted(set(spec.stop_token_ids) | (set() if spec.ignore_eos else set(spec.eos_token_ids)))
        # With nothing to ban (ignore_eos and no stop ids: how benchmarks fix output lengths) min_tokens masks
        # nothing, so the row takes no masking work a step and stays plain greedy.
        active = spec.min_tokens if banned else 0
        self.h_min_tokens[slot] = active
        self.min_tokens[slot].fill_(active)
        if active <= 0:
            return
        if len(banned) > self.max_stop_ids:
            raise ValueError(f"{len(banned)} stop and EOS token ids; at most {self.max_stop_ids} with min_tokens")
        self.stop_ids[slot].fill_(-1)
        self.stop_ids[slot, : len(banned)] = upload(np.asarray(banned, np.int64), self.device)

    # -- per step ------------------------------------------------------------------------------
    def process_logits(self, logits: torch.Tensor, slots: torch.Tensor, h_slots: np.ndarray,
                       sample_pos: torch.Tensor | None = None, draft_counts: torch.Tensor | None = None) -> torch.Tensor:
        """Penalties, logit bias and min_tokens masking on logits [S, V] fp32 (in place).

        Speculative rows: sample_pos [S] is each sample's position in its row (the tokens it comes
        after that are not generated yet, as min_tokens counts them) and draft_counts [S, V] int32
        the drafts before it, which penalties count as generated."""
        if self.h_penalties[h_slots].any():
            from lightspeed_kernel import ops

            counts = self.output_counts[slots]
            if draft_counts is not None:
                counts = counts + draft_counts
            ops.apply_penalties(logits, counts, self.prompt_mask[slots],
                                self.presence[slots], self.frequency[slots], self.repetition[slots])
        if self.h_bias[h_slots].any():
            width = self._bias_width
            logits.scatter_add_(1, self.bias_ids[slots, :width], self.bias_vals[slots, :width])
        with_min = self.h_min_tokens[h_slots] > 0
        if with_min.any():
            rows = upload(np.nonzero(with_min)[0], logits.device)
            row_slots = slots[rows]
            # Outputs so far: the RNG counter (on the device, current even under overlap).
            produced = self.offsets[row_slots] + (sample_pos[rows] if sample_pos is not None else 0)
            blocked = produced < self.min_tokens[row_slots]               # [R]
            ids = self.stop_ids[row_slots]                                 # [R, K], -1 = pad
            # No boolean indexing: its data-dependent shape would make the host wait for the GPU.
            # Banned ids of blocked rows take -inf, the rest +inf, and a min-reduction leaves the
            # other logits untouched.
            ban = torch.where((ids >= 0) & blocked[:, None], float("-inf"), float("inf"))
            logits[rows] = logits[rows].scatter_reduce_(1, ids.clamp(min=0), ban, reduce="amin")
        return logits

    def plain_greedy(self, h_slots: np.ndarray) -> bool:
        """Every row greedy with nothing that edits its logits (penalties, logit bias, min_tokens): its
        token is the argmax of the raw logits."""
        return bool(self.h_greedy[h_slots].all() and not self.h_penalties[h_slots].any()
                    and not self.h_bias[h_slots].any() and not (self.h_min_tokens[h_slots] > 0).any())

    def sample(self, logits: torch.Tensor, slots: torch.Tensor, h_slots: np.ndarray,
               sample_pos: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids int64 [S]: argmax when every row is greedy, else the batched seeded sampler.
        A speculative row's position j draws with RNG counter (outputs so far + j): the draw the
        engine would make there without speculation."""
        from lightspeed_kernel import ops

        if self.h_greedy[h_slots].all():
            return ops.greedy(logits)

        offsets = self.offsets[slots] if sample_pos is None else self.offsets[slots] + sample_pos
        return ops.sample(logits, self.temperature[slots], self.top_k[slots], self.top_p[slots],
                          self.min_p[slots], self.seeds[slots], offsets)

    def _ones(self, n: int) -> torch.Tensor:
        if self._ones_buf.shape[0] < n:  # speculative steps sample up to k + 1 rows a request
            self._ones_buf = torch.ones(2 * n, dtype=torch.int64, device=self._ones_buf.device)
        return self._ones_buf[:n]

    def record(self, tokens: torch.Tensor, slots: torch.Tensor, h_slots: np.ndarray,
               keep: torch.Tensor | None = None) -> None:
        """Advance RNG counters and penalty counts after sampling `tokens` [S] for `slots` [S];
        keep [S] (speculative steps): only the accepted samples count."""
        weight = self._ones(slots.shape[0]) if keep is None else keep.to(slots.dtype)
        self.offsets.index_add_(0, slots, weight)
        if self.h_penalties[h_slots].any():
            self.output_counts.index_put_((slots, tokens), weight.to(torch.int32), accumulate=True)
