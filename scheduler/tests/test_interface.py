"""The Python contract other packages code against: names, dtypes, shapes, batch order."""

from pathlib import Path

import lightspeed_scheduler
import numpy as np
import pytest
import tomllib
from lightspeed_scheduler import Plan, RequestSpec, Scheduler, SchedulerConfig
from scheduler_helpers import make_scheduler, samples, spec


def test_public_names():
    assert set(lightspeed_scheduler.__all__) >= {"Scheduler", "SchedulerConfig", "RequestSpec", "Plan",
                                                 "DraftProposer"}
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert lightspeed_scheduler.__version__ == pyproject["project"]["version"]


def test_config_is_keyword_only_and_frozen():
    config = SchedulerConfig(page_size=32, num_device_pages=64)
    assert config.page_size == 32 and config.num_device_pages == 64 and config.policy == "decode_first"
    assert config.eviction_policy == "queue" and "eviction_policy='queue'" in repr(config)
    with pytest.raises(AttributeError):
        config.page_size = 16
    with pytest.raises(TypeError):
        SchedulerConfig(16)


def test_plan_fields_dtypes_and_shapes(scheduler: Scheduler):
    first = scheduler.submit(spec("a", range(3, 43)))  # 40 tokens: 3 pages of 16
    second = scheduler.submit(spec("b", range(100, 110)))
    assert isinstance(first, int) and second == first + 1
    plan = scheduler.next_plan()
    assert isinstance(plan, Plan)
    dtypes = {
        "req_ids": np.int64, "req_slots": np.int32, "input_ids": np.int32, "positions": np.int64,
        "query_start_loc": np.int32, "seq_lens": np.int32, "cached_lens": np.int32,
        "page_table": np.int32, "slot_mapping": np.int64, "logits_indices": np.int32,
        "sample_batch_rows": np.int32, "deferred_input_mask": np.bool_, "deferred_src_index": np.int32,
        "load_back": np.int32, "write_back": np.int32,
    }
    for name, dtype in dtypes.items():
        assert getattr(plan, name).dtype == dtype, name
    assert plan.num_prefills == 2 and plan.num_decodes == 0 and plan.num_decode_tokens == 0
    np.testing.assert_array_equal(plan.req_ids, [first, second])
    np.testing.assert_array_equal(plan.query_start_loc, [0, 40, 50])
    np.testing.assert_array_equal(plan.seq_lens, [40, 10])
    np.testing.assert_array_equal(plan.cached_lens, [0, 0])
    np.testing.assert_array_equal(plan.input_ids[:40], np.arange(3, 43))
    np.testing.assert_array_equal(plan.positions[40:], np.arange(10))
    assert plan.page_table.shape == (2, 3)
    assert plan.page_table[1, 1] == 0 and plan.page_table[1, 2] == 0  # padded with page 0
    pages = plan.page_table[0]
    expected_slots = pages[np.arange(40) // 16] * 16 + np.arange(40) % 16
    np.testing.assert_array_equal(plan.slot_mapping[:40], expected_slots)
    np.testing.assert_array_equal(plan.logits_indices, [39, 49])
    np.testing.assert_array_equal(plan.sample_batch_rows, [0, 1])
    assert plan.max_query_len == 40
    assert plan.load_back.shape == (0, 2) and plan.write_back.shape == (0, 2)
    assert set(plan.req_slots.tolist()) <= set(range(256))
    assert not plan.deferred_input_mask.any() and (plan.deferred_src_index == -1).all()
    assert scheduler.advance(plan, np.array([5, 6], dtype=np.int32)) == []

    # Next step: both decode; the first's sampled token is its input at position 40.
    plan = scheduler.next_plan()
    assert plan.num_decodes == 2 and plan.num_prefills == 0 and plan.num_decode_tokens == 2
    np.testing.assert_array_equal(plan.input_ids, [5, 6])
    np.testing.assert_array_equal(plan.positions, [40, 10])
    np.testing.assert_array_equal(plan.cached_lens, [40, 10])
    np.testing.assert_array_equal(plan.seq_lens, [41, 11])
    assert plan.page_table.shape == (2, 3)


def test_decodes_come_before_prefills(scheduler: Scheduler):
    scheduler.submit(spec("a", range(3, 20)))
    scheduler.advance(scheduler.next_plan(), [9])
    scheduler.submit(spec("b", range(30, 60)))
    plan = scheduler.next_plan()
    assert plan.num_decodes == 1 and plan.num_prefills == 1
    assert plan.query_start_loc[1] == plan.num_decode_tokens == 1
    assert plan.seq_lens[0] == 18 and plan.seq_lens[1] == 30


def test_finish_reasons_and_request_stats(scheduler: Scheduler):
    eos = scheduler.submit(spec("eos", range(3, 10), eos_token_ids=[2]))
    length = scheduler.submit(spec("len", range(3, 10), max_new_tokens=2))
    stop = scheduler.submit(spec("stop", range(3, 10), stop_token_ids=[99], eos_token_ids=[]))
    ignore = scheduler.submit(spec("ign", range(3, 10), ignore_eos=True, max_new_tokens=3))
    finished = {}
    tokens = {eos: [8, 2], length: [8, 8], stop: [8, 99], ignore: [2, 2, 2]}
    for step in range(3):
        plan = scheduler.next_plan()
        sampled = np.array([tokens[int(r)][step] for r in plan.req_ids], dtype=np.int32)
        for req_id, reason in scheduler.advance(plan, sampled):
            finished[req_id] = reason
            assert scheduler.request_stats(req_id)["state"] in {"finished", "writing_back"}
    assert finished == {eos: "stop", length: "length", stop: "stop", ignore: "length"}
    stats = scheduler.request_stats(ignore)
    assert stats["num_prompt_tokens"] == 7 and stats["num_output_tokens"] == 3
    assert scheduler.output_token_ids(ignore) == [2, 2, 2]
    assert not scheduler.has_unfinished() and scheduler.num_unfinished == 0


def test_stats_keys(scheduler: Scheduler):
    stats = scheduler.stats()
    for key in ("free_device_pages", "free_host_pages", "num_waiting", "num_running", "num_retracted",
                "prefix_hit_tokens", "prefix_query_tokens", "num_device_pages", "num_host_pages"):
        assert key in stats
    assert stats["free_device_pages"] == 1023 and stats["num_device_pages"] == 1024


def test_request_spec_defaults():
    request = RequestSpec(rid="x", token_ids=[1, 2, 3])
    assert request.max_new_tokens == 16 and request.eos_token_ids == [] and request.priority == 0
    assert request.num_draft_tokens == 0 and request.ignore_eos is False


def test_views_keep_data_alive_through_the_next_plan():
    scheduler = make_scheduler()
    scheduler.submit(spec("a", range(3, 20), max_new_tokens=5))
    first = scheduler.next_plan()
    positions = first.positions
    scheduler.advance(first, samples(first))
    second = scheduler.next_plan()
    # Double buffering: plan N's arrays are untouched while plan N + 1 exists.
    np.testing.assert_array_equal(positions, np.arange(17))
    assert second.positions.tolist() == [17]


def test_views_are_reused_while_shapes_hold_and_outlive_the_scheduler():
    import gc

    s = make_scheduler()
    for i in range(4):
        s.submit(spec(f"r{i}", range(3 + i, 40 + i), max_new_tokens=50))
    arrays = []
    for _ in range(5):
        plan = s.next_plan()
        arrays.append((plan.positions, plan.page_table))
        s.advance(plan, samples(plan))
    # Steady decode: each buffer hands back the same array objects, refilled in place.
    assert arrays[2][0] is arrays[4][0] and arrays[2][1] is arrays[4][1]
    assert arrays[3][0] is not arrays[4][0]  # the other buffer
    positions = arrays[4][0]
    expected = positions.copy()
    del s, plan, arrays
    gc.collect()
    np.testing.assert_array_equal(positions, expected)  # the buffer outlives the scheduler


def test_token_ids_accept_numpy_arrays_and_reject_overflow():
    tokens = np.arange(3, 40)
    for array in (tokens.astype(np.int32), tokens.astype(np.int64), tokens.astype(np.uint16)):
        assert RequestSpec(rid="a", token_ids=array).token_ids == tokens.tolist()
    with pytest.raises(ValueError, match="outside int32"):
        RequestSpec(rid="a", token_ids=np.array([3, 2**40]))
    s = make_scheduler()
    req = s.submit(RequestSpec(rid="a", token_ids=tokens, eos_token_ids=np.array([2])))
    plan = s.next_plan()
    np.testing.assert_array_equal(plan.input_ids, tokens)
    assert s.advance(plan, np.array([2], dtype=np.int64)) == [(req, "stop")]
