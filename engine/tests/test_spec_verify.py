"""Verification of speculative rows (lightspeed/spec/step.py, spec/inputs.py) on synthetic steps:
longest-prefix acceptance, chain checks, provisional-row shifts, and a chi-square test that the
kept tokens are distributed as the target's sampling distribution."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightspeed.core.messages import SamplingSpec
from lightspeed.runner.inputs import StepTensors
from lightspeed.runner.sampling_state import SamplingState
from lightspeed.spec.inputs import chain_ok, deferred_rows, shift_provisional_rows
from lightspeed.spec.step import SpecStep

CPU = torch.device("cpu")


def decode_plan(row_tokens: list[int], prefill_samples: int = 0, slots=None):
    """Decode rows with the given token counts (each samples all), then prefill rows sampling once."""
    qsl = np.concatenate([[0], np.cumsum(row_tokens)]).astype(np.int32)
    ndt = int(qsl[-1])
    rows = np.concatenate([np.repeat(np.arange(len(row_tokens)), row_tokens),
                           len(row_tokens) + np.arange(prefill_samples)]).astype(np.int32)
    return SimpleNamespace(num_decodes=len(row_tokens), num_decode_tokens=ndt, query_start_loc=qsl,
                           num_samples=ndt + prefill_samples, sample_batch_rows=rows,
                           req_slots=np.asarray(slots if slots is not None else range(len(row_tokens)), np.int32))


def test_accepts_the_longest_prefix_of_drafts_the_target_agrees_with():
    plan = decode_plan([4, 1, 3], prefill_samples=1)
    step = SpecStep.build(plan, CPU)
    # Row 0: x d1 d2 d3 = 9 5 6 7; row 1: no drafts; row 2: x d1 d2 = 9 8 8. Then a prefill token.
    inputs = torch.tensor([9, 5, 6, 7, 9, 9, 8, 8, 3])
    tokens = torch.tensor([5, 6, 1, 4,  # agrees with d1, d2, then not: keep 3 (5 6 1)
                           2,           # no drafts: keep 1
                           7, 8, 8,     # rejects d1 at once: keep 1
                           11])         # the prefill's sample
    accepted, keep = step.verify(tokens, inputs[: plan.num_decode_tokens + 1])
    assert accepted.tolist() == [3, 1, 1]
    assert keep.tolist() == [True, True, True, False, True, True, False, False, True]
    assert step.rejected_by_sample(accepted, 9).tolist() == [1, 1, 1, 1, 0, 2, 2, 2, 0]
    step.chain_ok = torch.tensor([False, True, True])  # row 0's drafts followed a wrong guess
    accepted, _ = step.verify(tokens, inputs)
    assert accepted.tolist() == [1, 1, 1]


def test_all_drafts_accepted_keeps_the_bonus_token():
    step = SpecStep.build(decode_plan([3]), CPU)
    accepted, keep = step.verify(torch.tensor([4, 5, 6]), torch.tensor([1, 4, 5]))
    assert accepted.tolist() == [3] and keep.all()


def test_draft_prefix_pairs_count_the_drafts_before_each_position():
    plan = decode_plan([3, 2])
    step = SpecStep.build(plan, CPU)
    samples, tokens = step.draft_prefix_pairs(plan)
    # Row 0 samples at 0, 1, 2 see drafts {}, {t1}, {t1, t2}; row 1 at 3, 4 sees {}, {t4}.
    assert sorted(zip(samples.tolist(), tokens.tolist(), strict=True)) == [(1, 1), (2, 1), (2, 2), (4, 4)]
    counts = step.draft_counts(plan, torch.tensor([0, 7, 7, 0, 3]), plan.num_samples, 10)
    assert counts[2, 7] == 2 and counts[1, 7] == 1 and counts[4, 3] == 1 and counts.sum() == 4


@pytest.mark.parametrize("from_packet", [False, True])
def test_provisional_rows_move_down_by_what_the_in_flight_row_rejected(from_packet):
    # Row 0 (2 tokens) followed an in-flight row whose last sample was index 3 and that rejected 2;
    # row 1 is not deferred. Page size 4, pages [5, 6] and [7].
    plan = SimpleNamespace(query_start_loc=np.array([0, 2, 3], np.int32),
                           deferred_input_mask=np.array([True, False, False]),
                           deferred_src_index=np.array([3, -1, -1], np.int32))
    t = StepTensors(input_ids=torch.tensor([0, 42, 9]), positions=torch.tensor([6, 7, 2]),
                    slot_mapping=torch.tensor([5 * 4 + 2, 5 * 4 + 3, 7 * 4 + 2]),
                    query_start_loc=torch.tensor([0, 2, 3], dtype=torch.int32),
                    seq_lens=torch.tensor([8, 3], dtype=torch.int32),
                    page_table=torch.tensor([[5, 6], [7, 0]], dtype=torch.int32),
                    logits_indices=torch.arange(3), sample_slots=torch.arange(3), h_sample_slots=np.arange(3),
                    h_sample_req_ids=np.arange(3))
    rows, src = deferred_rows(plan)
    if from_packet:  # the step packet's deferred inputs, on the device, are what the shift reads
        t.deferred_mask, t.deferred_src = torch.tensor([True, False, False]), torch.tensor([3, 0, 0])
        plan.deferred_input_mask, plan.deferred_src_index = None, None
    assert rows.tolist() == [0] and src.tolist() == [3]
    prev_sampled = torch.tensor([10, 11, 12, 13])
    prev_rejected = torch.tensor([2, 2, 2, 2])
    shift = shift_provisional_rows(plan, t, rows, src, prev_rejected, prev_sampled, page_size=4)
    assert shift.tolist() == [2, 0]
    assert t.positions.tolist() == [4, 5, 2]
    assert t.slot_mapping.tolist() == [6 * 4 + 0, 6 * 4 + 1, 7 * 4 + 2]
    assert t.seq_lens.tolist() == [6, 3]
    assert t.input_ids.tolist() == [11, 42, 9]  # the bonus landed at sample 3 - 2
    ok = chain_ok(plan, t, rows, shift, np.array([11, -1, -1]), num_decodes=2)
    assert ok.tolist() == [False, True]  # right guess, but the in-flight row rejected drafts
    ok = chain_ok(plan, t, rows, torch.zeros(2, dtype=torch.int64), np.array([11, -1, -1]), num_decodes=2)
    assert ok.tolist() == [True, True]


def _chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """p-value of Pearson's chi-square statistic (cells with expectation > 0)."""
    use = expected > 0
    stat = float(((observed[use] - expected[use]) ** 2 / expected[use]).sum())
    dof = int(use.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def _target_probs(logits: torch.Tensor, spec: SamplingSpec) -> np.ndarray:
    """Temperature, then top-k, then top-p over what is left (vLLM's order), written out plainly."""
    probs = torch.softmax(logits.double() / spec.temperature, dim=-1).numpy()
    out = np.zeros_like(probs)
    for row, p in enumerate(probs):
        order = np.argsort(-p)
        kept = order[: spec.top_k] if spec.top_k > 0 else order
        mass = p[kept] / p[kept].sum()
        cut = int(np.searchsorted(np.cumsum(mass) - mass, spec.top_p, side="left"))
        kept = kept[: max(cut, 1)]
        out[row, kept] = p[kept] / p[kept].sum()
    return out


@pytest.mark.parametrize("spec", [
    SamplingSpec(max_tokens=8, temperature=1.0),
    SamplingSpec(max_tokens=8, temperature=0.7, top_k=4, top_p=0.9),
], ids=["temperature", "top-k-top-p"])
def test_kept_tokens_are_distributed_as_the_target(spec):
    """Many seeds, one row each: x d1 d2 with fixed logits per position over 6 tokens. The first
    kept token must follow the target's (transformed) distribution p0, and the second, kept only
    when the first equals d1, must follow p1: the distribution the engine samples without drafts."""
    seeds, vocab = 6000, 6
    d1, d2 = 1, 4
    base = torch.tensor([[2.0, 1.5, 1.0, 0.2, -0.5, -1.0], [0.0, 0.3, -0.2, 1.1, 1.4, 0.1],
                         [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]])
    state = SamplingState(seeds, vocab, CPU)
    for slot in range(seeds):
        state.bind(slot, slot, spec, [0], [])
        state.seeds[slot] = slot
    plan = decode_plan([3] * seeds)
    step = SpecStep.build(plan, CPU)
    slots = torch.arange(seeds).repeat_interleave(3)
    logits = base.repeat(seeds, 1)
    tokens = state.sample(logits.clone(), slots, slots.numpy(), step.sample_pos)
    inputs = torch.tensor([0, d1, d2]).repeat(seeds)
    accepted, keep = step.verify(tokens, inputs)
    probs = _target_probs(base, spec)
    per_row = tokens.view(seeds, 3).numpy()
    first = np.bincount(per_row[:, 0], minlength=vocab)
    assert _chi_square_p(first, probs[0] * seeds) > 1e-3
    went_on = per_row[:, 0] == d1
    assert accepted.numpy()[~went_on].max() == 1 and (accepted.numpy()[went_on] >= 2).all()
    second = np.bincount(per_row[went_on, 1], minlength=vocab)
    assert _chi_square_p(second, probs[1] * went_on.sum()) > 1e-3
    # The positions draw independently: the pair (t0, t1) is not correlated.
    pair = np.bincount(per_row[:, 0] * vocab + per_row[:, 1], minlength=vocab * vocab)
    assert _chi_square_p(pair, np.outer(probs[0], probs[1]).ravel() * seeds) > 1e-3
    assert keep.view(seeds, 3)[:, 0].all()
