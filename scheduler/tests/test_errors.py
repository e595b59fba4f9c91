"""Bad input raises ValueError with a clear message and leaves the scheduler usable."""

import numpy as np
import pytest
from lightspeed_scheduler import SchedulerConfig
from scheduler_helpers import make_scheduler, samples, spec


@pytest.mark.parametrize("field, value, message", [
    ("policy", "shortest_job_first", "unknown policy"),
    ("eviction_policy", "lfu", "unknown eviction_policy 'lfu' \\(expected 'queue' or 'lru'\\)"),
    ("num_device_pages", 1, "num_device_pages must be >= 2"),
    ("num_host_pages", 1, "num_host_pages must be 0 \\(no host tier\\) or >= 2"),
    ("max_write_through_pages", 0, "max_write_through_pages must be >= 1"),
    ("page_size", 0, "page_size"),
    ("max_num_seqs", 0, "max_num_seqs"),
    ("max_num_batched_tokens", 0, "max_num_batched_tokens"),
    ("chunked_prefill_size", 0, "chunked_prefill_size"),
    ("max_model_len", 0, "max_model_len"),
])
def test_bad_config(field, value, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**{field: value})


def test_bad_requests_leave_the_scheduler_usable():
    s = make_scheduler(max_model_len=64)
    live = s.submit(spec("live", range(3, 10), max_new_tokens=3))
    cases = [
        (spec("empty", []), "empty prompt"),
        (spec("long", range(3, 3 + 65)), "longer than max_model_len"),
        (spec("zero", range(3, 6), max_new_tokens=0), "max_new_tokens"),
        (spec("live", range(3, 6)), "duplicate live rid"),
        (spec("neg", [3, -1]), "negative token id"),
        (spec("drafts", range(3, 6), num_draft_tokens=100), "num_draft_tokens"),
    ]
    for request, message in cases:
        with pytest.raises(ValueError, match=message):
            s.submit(request)
    with pytest.raises(ValueError, match="unknown request id"):
        s.abort(9999)
    with pytest.raises(ValueError, match="unknown request id"):
        s.request_stats(9999)
    assert s.num_unfinished == 1
    finished = []
    while not finished:
        plan = s.next_plan()
        finished = s.advance(plan, samples(plan))
    assert finished == [(live, "length")]
    s.check_invariants()
    # A finished rid may be reused.
    s.submit(spec("live", range(3, 6)))


def test_prompt_larger_than_the_device_pool_is_rejected():
    s = make_scheduler(page_size=4, num_device_pages=4)
    with pytest.raises(ValueError, match="KV pages"):
        s.submit(spec("big", range(3, 40)))


def test_bad_advance_calls():
    s = make_scheduler()
    s.submit(spec("a", range(3, 10)))
    plan = s.next_plan()
    with pytest.raises(ValueError, match="expected 1 sampled"):
        s.advance(plan, [])
    with pytest.raises(ValueError, match="negative"):
        s.advance(plan, [-4])
    with pytest.raises(TypeError):
        s.advance(plan, "nope")
    s.advance(plan, np.array([9], dtype=np.int64))  # any int dtype converts
    with pytest.raises(ValueError, match="not in flight"):
        s.advance(plan, [9])
    plan = s.next_plan()
    assert s.advance(plan, samples(plan)) == []


def test_abort_of_a_finished_request_is_rejected():
    s = make_scheduler()
    a = s.submit(spec("a", range(3, 10), max_new_tokens=1))
    plan = s.next_plan()
    assert s.advance(plan, samples(plan)) == [(a, "length")]
    with pytest.raises(ValueError, match="already finished|unknown"):
        s.abort(a)
