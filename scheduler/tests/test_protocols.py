"""Synchronous and one-plan-in-flight protocols drive the same requests to the same outputs.

A toy engine fills deferred inputs from the previous plan's samples (as the GPU would) and samples
deterministically from (input token, position), so any mistake in positions, deferred indices,
row discarding or finishing shows up as a different output sequence.
"""

import numpy as np
import pytest
from scheduler_helpers import make_scheduler, spec

EOS = 2


def toy_model(input_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    nxt = (input_ids.astype(np.int64) * 31 + positions * 7) % 97
    return np.where(nxt == 0, EOS, nxt % 50 + 3).astype(np.int32)


def run(protocol: str, **config) -> dict[str, tuple[list[int], str]]:
    s = make_scheduler(**config)
    rng = np.random.default_rng(1)
    ids, limits = {}, {}
    for i in range(12):
        prompt = rng.integers(3, 60, size=int(rng.integers(1, 70))).tolist()
        limit = int(rng.integers(1, 40))
        req_id = s.submit(spec(f"r{i}", prompt, max_new_tokens=limit))
        ids[req_id], limits[req_id] = f"r{i}", limit
    outputs, reasons = {}, {}
    prev_samples = np.zeros(0, dtype=np.int32)
    in_flight = None
    for _ in range(500):
        if not s.has_unfinished() and in_flight is None:
            break
        plan = s.next_plan()
        inputs = plan.input_ids.copy()
        mask = plan.deferred_input_mask
        if protocol == "sync":
            assert not mask.any()
        inputs[mask] = prev_samples[plan.deferred_src_index[mask]]
        logits_rows = plan.logits_indices
        sampled = toy_model(inputs[logits_rows], plan.positions[logits_rows])
        to_advance = [(plan, sampled)]
        if protocol == "overlap":
            to_advance = [] if in_flight is None else [in_flight]
            in_flight = (plan, sampled)
        prev_samples = sampled
        for done_plan, done_samples in to_advance:
            for req_id, reason in s.advance(done_plan, done_samples):
                outputs[ids[req_id]] = s.output_token_ids(req_id)
                reasons[ids[req_id]] = reason
        if protocol == "overlap" and not s.has_unfinished() and in_flight is not None:
            s.advance(*in_flight)
            in_flight = None
        s.check_invariants()
        assert plan.num_reqs <= s.config.max_num_seqs
        # Spare slots: past max_num_seqs only while requests whose last token is in flight hold theirs.
        finishing = 0 if in_flight is None else sum(
            1 for r in set(in_flight[0].req_ids.tolist())
            if ids[r] not in outputs and len(s.output_token_ids(r)) + 1 >= limits[r])
        assert s.stats()["num_running"] - finishing <= s.config.max_num_seqs
    return {rid: (outputs[rid], reasons[rid]) for rid in outputs}


@pytest.mark.parametrize("config", [
    dict(),
    dict(page_size=4, num_device_pages=40, num_host_pages=64, max_num_batched_tokens=64, chunked_prefill_size=16),
    dict(page_size=4, num_device_pages=40, num_host_pages=2, max_num_seqs=4, max_num_batched_tokens=32,
         chunked_prefill_size=8, policy="prefill_first"),
    dict(max_num_seqs=3, num_spare_slots=1),
    dict(page_size=4, num_device_pages=40, num_host_pages=64, max_num_seqs=4, num_spare_slots=4,
         max_num_batched_tokens=64, chunked_prefill_size=16),
    dict(max_num_seqs=2, num_spare_slots=2, policy="prefill_first"),
])
def test_sync_and_overlap_produce_the_same_outputs(config):
    sync = run("sync", **config)
    overlap = run("overlap", **config)
    assert len(sync) == 12
    assert sync == overlap
    assert {reason for _, reason in sync.values()} <= {"stop", "length"}
    for tokens, reason in sync.values():
        assert (tokens[-1] == EOS) == (reason == "stop")


def test_overlap_marks_deferred_inputs_with_source_indices():
    s = make_scheduler()
    a = s.submit(spec("a", range(3, 20), max_new_tokens=8))
    b = s.submit(spec("b", range(30, 35), max_new_tokens=8))
    first = s.next_plan()
    second = s.next_plan()
    assert second.num_decodes == 2
    assert second.deferred_input_mask.all()
    rows = {int(r): i for i, r in enumerate(first.req_ids)}
    np.testing.assert_array_equal(second.deferred_src_index, [rows[a], rows[b]])
    with pytest.raises(ValueError, match="in flight"):
        s.next_plan()
    with pytest.raises(ValueError, match="in order"):
        s.advance(second, [1, 1])
    assert s.advance(first, [5, 6]) == []
    assert s.advance(second, [7, 8]) == []
    assert s.output_token_ids(a) == [5, 7] and s.output_token_ids(b) == [6, 8]


@pytest.mark.parametrize("spare", [0, 1])
def test_a_spare_slot_starts_a_waiting_request_beside_one_that_is_finishing(spare):
    s = make_scheduler(max_num_seqs=1, num_spare_slots=spare)
    assert s.config.num_slots == 1 + spare
    a = s.submit(spec("a", range(3, 20), max_new_tokens=2, ignore_eos=True))
    b = s.submit(spec("b", range(30, 40), max_new_tokens=2, ignore_eos=True))
    prefill_a = s.next_plan()
    last_of_a = s.next_plan()             # a's second and last token
    assert last_of_a.req_ids.tolist() == [a]
    assert s.advance(prefill_a, [5]) == []
    after = s.next_plan()                 # a's last token is in flight
    if spare:
        assert after.req_ids.tolist() == [b]                       # b takes a's row at once ...
        assert after.req_slots.tolist() == [1]                     # ... in the spare slot
    else:
        assert after.num_reqs == 0                                 # b waits for a's slot
    assert s.advance(last_of_a, [6]) == [(a, "length")]
    s.advance(after, np.full(after.num_samples, 7, dtype=np.int32))
    nxt = s.next_plan()
    assert nxt.req_ids.tolist() == [b]
    assert nxt.num_decodes == spare and nxt.num_prefills == 1 - spare
    s.check_invariants()


def test_spare_slots_are_validated_and_size_draft_inputs():
    with pytest.raises(ValueError, match="num_spare_slots"):
        make_scheduler(max_num_seqs=2, num_spare_slots=3)
    with pytest.raises(ValueError, match="num_spare_slots"):
        make_scheduler(max_num_seqs=2, num_spare_slots=-1)
    s = make_scheduler(max_num_seqs=2, num_spare_slots=1, max_num_draft_tokens=2)
    s.submit(spec("a", range(3, 20)))
    with pytest.raises(ValueError, match="3 draft counts"):
        s.next_plan(num_draft_tokens=np.zeros(2, dtype=np.int32))
    assert s.next_plan(num_draft_tokens=np.zeros(3, dtype=np.int32)).num_reqs == 1


def test_speculative_rows_take_accepted_counts():
    s = make_scheduler(page_size=4, enable_prefix_cache=False)
    a = s.submit(spec("a", range(3, 9), max_new_tokens=20, num_draft_tokens=3))
    s.advance(s.next_plan(), [40])
    plan = s.next_plan()
    assert plan.num_decode_tokens == 4 and plan.num_samples == 4
    np.testing.assert_array_equal(plan.positions, [6, 7, 8, 9])
    np.testing.assert_array_equal(plan.logits_indices, [0, 1, 2, 3])
    np.testing.assert_array_equal(plan.sample_batch_rows, [0, 0, 0, 0])
    free_before = s.stats()["free_device_pages"]
    with pytest.raises(ValueError, match="accepted_counts"):
        s.advance(plan, [41, 42, 43, 44])
    with pytest.raises(ValueError, match="outside"):
        s.advance(plan, [41, 42, 43, 44], accepted_counts=np.array([0], dtype=np.int32))
    s.advance(plan, np.array([41, 42, 43, 44], dtype=np.int32), accepted_counts=np.array([2], dtype=np.int32))
    assert s.output_token_ids(a) == [40, 41, 42]
    assert s.stats()["free_device_pages"] == free_before + 1  # the rejected tail's page went back
    nxt = s.next_plan()
    assert nxt.cached_lens[0] == 8 and nxt.input_ids[0] == 42
