"""Speculative decoding from Python: per-step drafts in next_plan(), appended_counts, DraftProposer."""

import numpy as np
import pytest
from lightspeed_scheduler import DraftProposer
from scheduler_helpers import make_scheduler, samples, spec


def test_per_step_drafts_land_in_the_plan_and_rows_continue_under_overlap():
    s = make_scheduler(max_num_seqs=4, max_num_draft_tokens=3)
    a = s.submit(spec("a", range(10, 30), max_new_tokens=50))
    plan = s.next_plan()
    s.advance(plan, samples(plan, 40))
    counts = np.full(4, 3, dtype=np.int32)
    drafts = np.arange(4 * 3, dtype=np.int32).reshape(4, 3) + 100
    first = s.next_plan(counts, drafts)
    slot = int(first.req_slots[0])
    assert first.input_ids.tolist() == [40, *drafts[slot].tolist()]
    second = s.next_plan(counts, drafts)  # `first` in flight: a provisional row, deferred input
    assert second.num_decode_tokens == 4 and second.deferred_input_mask[0]
    assert second.cached_lens[0] == first.cached_lens[0] + 4  # as if all of first's drafts are accepted
    s.advance(first, np.array([100 + 3 * slot, 101 + 3 * slot, 55, 56], np.int32), np.array([3], np.int32))
    assert first.appended_counts.tolist() == [3]
    s.advance(second, np.array([1, 1, 1, 1], np.int32), np.array([1], np.int32))
    assert s.output_token_ids(a) == [40, 100 + 3 * slot, 101 + 3 * slot, 55, 1]
    third = s.next_plan()  # nothing in flight: the true start
    assert third.cached_lens[0] == 20 + 5 - 1
    s.advance(third, samples(third))
    s.check_invariants()


def test_malformed_drafts_raise_value_error():
    s = make_scheduler(max_num_seqs=2, max_num_draft_tokens=2)
    s.submit(spec("a", range(10, 20)))
    with pytest.raises(ValueError, match="draft count"):
        s.next_plan(np.array([3, 0], np.int32))
    with pytest.raises(ValueError, match="one per slot"):
        s.next_plan(np.array([1], np.int32))
    with pytest.raises(TypeError, match="int32"):
        s.next_plan(np.array([1, 1], np.int32), np.zeros((2, 2), np.int64))
    assert s.stats()["num_steps"] == 0


def test_lookahead_is_configurable():
    s = make_scheduler(num_lookahead_tokens=3)
    assert s.config.num_lookahead_tokens == 3
    with pytest.raises(ValueError, match="num_lookahead_tokens"):
        make_scheduler(num_lookahead_tokens=-1)


def test_draft_proposer_from_python():
    p = DraftProposer(method="ngram", max_num_seqs=2, num_speculative_tokens=4, min_match=2, max_match=6)
    p.start(1, [1, 2, 3, 4, 5, 6, 1, 2], 8)
    out, counts = np.zeros((1, 5), np.int32), np.zeros(1, np.int32)
    p.propose(np.array([1], np.int32), [0], [0], np.zeros((1, 2), np.int32), out, counts)
    assert counts.tolist() == [4] and out[0, :4].tolist() == [3, 4, 5, 6]
    # One more token for a row whose sample is in flight, after its pending drafts 3 4.
    p.propose([1], [1], [2], np.array([[3, 4]], np.int32), out, counts)
    assert out[0, : counts[0]].tolist() == [5, 6, 1, 2, 3]
    p.commit([1, 1], [3, 4])
    p.observe([1], [4], [1])
    assert p.draft_length(1) == 2
    p.observe([1], [2], [0])
    p.observe([1], [1], [0])  # two drafts in a row wholly rejected: the slot stops drafting a while
    assert p.backoff_remaining(1) == 4
    p.propose([1], [0], [0], np.zeros((1, 2), np.int32), out, counts)
    assert counts.tolist() == [0]
    with pytest.raises(ValueError, match="unknown method"):
        DraftProposer(method="eagle")
    with pytest.raises(TypeError):
        p.propose([1], [0], [0], np.zeros((1, 2), np.int64), out, counts)
