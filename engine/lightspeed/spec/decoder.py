"""SpecDecoder: speculative decoding plugged into the model runner (a strategy object).

The runner calls it at fixed points of a step; the engine's loop only passes `plan_args()` to
`next_plan()` and the accepted counts to `advance()`:

    plan_args()             drafts wanted this step, by slot (and the drafts, for CPU drafters)
    prepare(plan, t)        after the inputs are on the device: move provisional rows, check
                            chains, fill device drafts; returns the step's SpecStep (or None)
    SpecStep.verify(...)    in the sampler, after every sampling transform
    after_sample(...)       keep what the next step's fix-ups need; a model drafter drafts here
    collect(...)            once the step's tokens are on the host: accepted counts for the
                            scheduler, commits for a CPU drafter, metrics

The drafter (`LookupDrafter`: ngram / suffix on the CPU; `DeviceLookupDrafter`: ngram_gpu;
`ModelDrafter`: MTP / EAGLE-3 on the device) only proposes; verification is the same for all
(spec/step.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .config import SpeculativeConfig
from .device_lookup import DeviceLookupDrafter, history_bytes, sampling_rows
from .inputs import chain_ok, deferred_rows, fill_device_drafts, shift_provisional_rows
from .lookup import LookupDrafter, conversation_group
from .step import SpecStep


@dataclass
class SpecLaunch:
    """What collect() needs of one launched step."""

    step_id: int
    row_drafts: np.ndarray                    # int32 [num_decodes]
    sample_rows: np.ndarray                   # int32 [S]: each sample's row (a copy of the plan's)
    decode_slots: np.ndarray                  # int32 [num_decodes]
    decode_first: np.ndarray                  # int32 [num_decodes]: each decode row's first sample
    step: SpecStep | None = None
    verdict: torch.Tensor | None = None       # int64 [2 or 3, num_decodes] on the host: accepted, chain ok,
                                              # [matched drafts (a drafter that reports them)]
    found_slots: np.ndarray | None = None     # ngram_gpu: slots it searched for after this step ...
    found: torch.Tensor | None = None         # ... and what each search matched (int32 on the host)


@dataclass
class SpecStats:
    """Cumulative counters (the gateway's /metrics reads them through EngineStats)."""

    num_drafts: int = 0             # decode rows that carried drafts
    num_draft_tokens: int = 0       # drafts proposed (verified)
    num_accepted_tokens: int = 0    # drafts accepted
    acceptance_lengths: list[int] = field(default_factory=list)  # [n]: rows with drafts that kept n tokens


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig, drafter, *, max_num_seqs: int, device: torch.device,
                 page_size: int):
        self.config, self.drafter, self.device, self.page_size = config, drafter, device, page_size
        self.k = config.num_speculative_tokens
        self.stats = SpecStats(acceptance_lengths=[0] * (self.k + 2))
        self._prev_rejected: torch.Tensor | None = None  # [S_prev]: drafts each sample's row rejected
        self._slots = max_num_seqs

    @property
    def lookahead(self) -> int:
        """KV tokens decode rows reserve past themselves (the scheduler's num_lookahead_tokens)."""
        return self.drafter.lookahead

    @property
    def needs_hidden(self) -> bool:
        return self.drafter.needs_hidden

    @property
    def drafts_on_host(self) -> bool:
        """Drafts come from the host's token history (n-gram / suffix), not from the device."""
        return not self.drafter.on_device

    # -- requests ----------------------------------------------------------------------------------
    def bind(self, slot: int, spec, prompt: list[int], outputs: list[int], session_id: str | None = None) -> None:
        # Grammar-constrained requests run without drafts: their masks need the host per token.
        enabled = spec.structured_kind is None
        self.drafter.bind(slot, prompt, outputs, conversation_group(session_id, prompt), enabled)

    def release(self, slot: int) -> None:
        self.drafter.release(slot)

    # -- one step ----------------------------------------------------------------------------------
    def plan_args(self) -> dict:
        return self.drafter.plan_args()

    def prepare(self, plan, t, prev_sampled: torch.Tensor | None) -> tuple[SpecStep | None, SpecLaunch]:
        nd = int(plan.num_decodes)
        row_drafts = np.maximum(np.diff(plan.query_start_loc[: nd + 1]) - 1, 0).astype(np.int32)
        rows, src = (deferred_rows(plan) if plan.num_tokens and plan.deferred_input_mask.any()
                     else (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        shift = None
        if self._prev_rejected is not None and rows.size:
            shift = shift_provisional_rows(plan, t, rows, src, self._prev_rejected, prev_sampled, self.page_size)
        self._prev_rejected = None
        guess_by_row = None
        if not self.drafter.on_device:
            deferred = np.zeros(plan.query_start_loc.shape[0] - 1, dtype=bool)
            deferred[rows] = True
            guess_by_row = self.drafter.record_plan(plan, row_drafts, deferred)
        launch = SpecLaunch(int(plan.step_id), row_drafts, plan.sample_batch_rows.copy(), plan.req_slots[:nd].copy(),
                            plan.query_start_loc[:nd].copy())
        if not row_drafts.any():
            return None, launch
        step = SpecStep.build(plan, self.device, t.query_start_loc)
        if self.drafter.on_device:
            fill_device_drafts(plan, t, self.drafter.drafts)
        if isinstance(self.drafter, DeviceLookupDrafter):  # verification reads each row's matched drafts (the last search's, in stream order)
            step.matched_by_slot, step.sample_slots = self.drafter.valid, t.sample_slots
        if rows.size and not self.drafter.on_device:
            # Device drafts were made after the in-flight step's verification: they continue its
            # true last token, wherever the row moved to, so only host drafts need the check.
            step.chain_ok = chain_ok(plan, t, rows, shift, guess_by_row, nd)
        launch.step = step
        return step, launch

    def after_sample(self, plan, t, step: SpecStep | None, launch: SpecLaunch, tokens: torch.Tensor,
                     accepted: torch.Tensor | None, keep: torch.Tensor | None, hidden: torch.Tensor | None,
                     *, to_host) -> None:
        """to_host(tensor) -> its host copy, valid once the step's event fired: the runner's result copies
        (`ResultCopies.to_host`, moved as LIGHTSPEED_STEP_IO says, runner/step_io.py)."""
        if step is not None:
            self._prev_rejected = step.rejected_by_sample(accepted, tokens.shape[0])
            launch.verdict = to_host(step.verdict)  # accepted, chain ok, [matched]: one copy
        if self.drafter.on_device:
            found = self.drafter.run(plan, t, tokens, accepted, keep, hidden)
            if found is not None:
                # A snapshot: `found` is the drafter's buffer, which the next step's lookup rewrites on the compute
                # stream, and a copy on the result stream may run after that.
                launch.found, launch.found_slots = to_host(found.clone()), plan.req_slots[sampling_rows(plan)].copy()

    def collect(self, launch: SpecLaunch, sample_slots: np.ndarray, tokens: np.ndarray,
                owned: np.ndarray) -> np.ndarray | None:
        """Accepted counts per decode row (None: the step had no drafts) of a collected step.
        sample_slots [S], tokens [S]; owned [S]: the sample's slot still holds its request."""
        nd = launch.row_drafts.shape[0]
        if launch.verdict is None:
            accepted, ok = np.ones(nd, np.int64), np.ones(nd, bool)
        else:
            verdict = launch.verdict.numpy()
            accepted, ok = verdict[0], verdict[1].astype(bool)
        drafted = launch.row_drafts
        if launch.verdict is not None and verdict.shape[0] > 2:
            # Only matched drafts count as drafts (a draft slot without a match holds token 0; should
            # it equal the target's token, that token is kept but not counted as an accepted draft).
            drafted = np.minimum(drafted, verdict[2]).astype(np.int32)
        with_drafts = drafted > 0
        lengths_kept = np.minimum(accepted, drafted + 1)
        st = self.stats
        st.num_drafts += int(with_drafts.sum())
        st.num_draft_tokens += int(drafted.sum())
        st.num_accepted_tokens += int((lengths_kept - 1)[with_drafts].sum())
        lengths, counts = np.unique(lengths_kept[with_drafts], return_counts=True)
        for length, count in zip(lengths.tolist(), counts.tolist(), strict=True):
            st.acceptance_lengths[length] += count
        if launch.found is not None:  # searches of rows whose request still holds its slot
            ndt = int((launch.row_drafts + 1).sum())
            still = np.concatenate([owned[launch.decode_first], owned[ndt:]])
            self.drafter.observe(launch.found_slots[still], launch.found.numpy()[still])
        if not self.drafter.on_device:
            self._collect_lookup(launch, sample_slots, tokens, owned, accepted, ok)
        return accepted.astype(np.int32) if launch.verdict is not None else None

    def _collect_lookup(self, launch: SpecLaunch, sample_slots, tokens, owned, accepted, ok) -> None:
        nd, rows = launch.row_drafts.shape[0], launch.sample_rows
        keep = np.ones(tokens.shape[0], dtype=bool)
        if launch.step is not None:
            dec = rows < nd
            keep[dec] = launch.step.h_sample_pos[dec] < accepted[rows[dec]]
        # Rows of released slots (their request finished meanwhile) commit nothing.
        use = keep & owned & self.drafter.bound[sample_slots]
        kept = np.nonzero(use)[0]
        # Per sampling row: its slot, whether it rejected drafts, its last kept token.
        last = kept[np.append(rows[kept][1:] != rows[kept][:-1], True)] if kept.size else kept
        last_rows = rows[last]
        partial = np.zeros(last.shape[0], dtype=bool)
        in_dec = last_rows < nd
        partial[in_dec] = accepted[last_rows[in_dec]] < launch.row_drafts[last_rows[in_dec]] + 1
        row_owned = owned[launch.decode_first] if nd else np.zeros(0, bool)
        drafted = np.where(ok & row_owned, launch.row_drafts, 0).astype(np.int32)
        self.drafter.collect(launch.step_id, sample_slots[use].astype(np.int32), tokens[use].astype(np.int32),
                             launch.decode_slots.astype(np.int32), drafted,
                             np.minimum(accepted - 1, drafted).astype(np.int32), sample_slots[last].astype(np.int32),
                             partial, tokens[last].astype(np.int64))


def spec_table_bytes(config: SpeculativeConfig | None, max_num_seqs: int, max_model_len: int) -> int:
    """Device bytes speculative decoding allocates beside the KV cache (ngram_gpu's token history)."""
    if config is None or config.method != "ngram_gpu":
        return 0
    return history_bytes(max_num_seqs, max_model_len, config.num_speculative_tokens)


def build_spec_decoder(config: SpeculativeConfig | None, *, model, model_config, num_slots: int,
                       device: torch.device, page_size: int, kv_cache=None, model_path: str | None = None,
                       load_format: str = "auto", max_model_len: int = 0, seed: int = 0) -> SpecDecoder | None:
    """The SpecDecoder for an engine, or None without speculative decoding. num_slots: the scheduler's request
    slots (drafts and histories are kept per slot). Raises ValueError for a draft model that cannot serve this
    target (start-up error)."""
    if config is None:
        return None
    if config.method == "ngram_gpu":
        drafter = DeviceLookupDrafter(config, max_num_seqs=num_slots, max_model_len=max_model_len, device=device)
    elif config.draft_model:
        from .model_drafter import build_model_drafter

        drafter = build_model_drafter(config, model=model, model_config=model_config, max_num_seqs=num_slots,
                                      device=device, page_size=page_size, kv_cache=kv_cache,
                                      model_path=model_path, load_format=load_format,
                                      max_model_len=max_model_len, seed=seed)
    else:
        drafter = LookupDrafter(config, num_slots)
    return SpecDecoder(config, drafter, max_num_seqs=num_slots, device=device, page_size=page_size)
