"""The disk tier's Python surface: plan arrays, disk_done, stop_disk_writes, restore_disk_pages."""

import numpy as np
import pytest
from scheduler_helpers import make_scheduler, samples, spec

PAGE = 4


def disk_scheduler(**overrides):
    config = dict(page_size=PAGE, num_device_pages=9, num_host_pages=5, num_disk_pages=64, max_num_seqs=4,
                  max_num_batched_tokens=64, chunked_prefill_size=16, max_model_len=256, async_copies=True)
    config.update(overrides)
    return make_scheduler(**config)


def run(s, records: list | None = None, fail_writes: bool = False) -> None:
    """Step until idle, acknowledging every copy and disk op at once; collects the disk writes."""
    for _ in range(500):
        if not (s.has_unfinished() or s.has_pending_copies()):
            return
        plan = s.next_plan()
        if records is not None:
            for row in range(plan.disk_write.shape[0]):
                records.append((int(plan.disk_write[row, 1]), *map(int, plan.disk_write_keys[row]),
                                plan.disk_write_tokens[row].copy()))
        s.advance(plan, samples(plan))
        if plan.has_copies:
            s.copies_done(plan.step_id)
        if plan.has_disk_ops:
            rows = np.arange(plan.disk_write.shape[0], dtype=np.int32)
            s.disk_done(plan.step_id, failed_writes=rows if fail_writes else ())
        s.check_invariants()
    raise AssertionError("never went idle")


def test_disk_arrays_dtypes_and_shapes():
    s = disk_scheduler()
    s.submit(spec("a", range(10, 27), max_new_tokens=2))
    shapes = {}
    for _ in range(50):
        plan = s.next_plan()
        if plan.has_disk_ops:
            shapes = {name: (getattr(plan, name).dtype, getattr(plan, name).shape) for name in (
                "disk_write", "disk_write_keys", "disk_write_tokens", "disk_read", "disk_read_keys", "disk_read_tokens")}
        s.advance(plan, samples(plan))
        if plan.has_copies:
            s.copies_done(plan.step_id)
        if plan.has_disk_ops:
            s.disk_done(plan.step_id)
        if shapes:
            break
    assert shapes["disk_write"] == (np.int32, (4, 2))
    assert shapes["disk_write_keys"] == (np.uint64, (4, 3))
    assert shapes["disk_write_tokens"] == (np.int32, (4, PAGE))
    assert shapes["disk_read"] == (np.int32, (0, 2)) and shapes["disk_read_keys"] == (np.uint64, (0,))
    assert shapes["disk_read_tokens"] == (np.int32, (0, PAGE))


def test_restore_after_restart_serves_the_prefix_from_disk():
    records = []
    first = disk_scheduler()
    first.submit(spec("a", range(10, 27), max_new_tokens=2))
    run(first, records)
    assert [r[3] for r in records] == [1, 2, 3, 4]  # depths, parents first
    slots = np.array([r[0] for r in records], np.int32)
    keys, parents = (np.array([r[i] for r in records], np.uint64) for i in (1, 2))
    depths = np.array([r[3] for r in records], np.int32)
    tokens = np.stack([r[4] for r in records]).astype(np.int32)

    s = disk_scheduler()
    bad_tokens = tokens.copy()
    bad_tokens[2, 0] += 1
    accepted = s.restore_disk_pages(slots, keys, parents, depths, bad_tokens)
    assert accepted.dtype == np.bool_ and accepted.tolist() == [True, True, False, False]  # the rest is orphaned
    s = disk_scheduler()
    assert s.restore_disk_pages(slots, keys, parents, depths, tokens).all()
    assert s.stats()["cached_disk_pages"] == 4
    req = s.submit(spec("a", range(10, 27), max_new_tokens=2))
    plan = s.next_plan()
    assert plan.disk_read.shape == (4, 2) and plan.disk_read[:, 0].tolist() == slots.tolist()
    assert plan.disk_read_keys.tolist() == keys.tolist()
    assert (plan.disk_read_tokens == tokens).all()
    s.advance(plan, samples(plan))
    s.disk_done(plan.step_id)
    stats = s.request_stats(req)
    assert stats["state"] == "disk_landed"
    assert stats["num_cached_tokens"] == stats["num_cached_disk_tokens"] == 16
    run(s)
    assert s.stats()["disk_hit_tokens"] == 16 and s.stats()["prefix_hit_tokens"] == 16
    with pytest.raises(ValueError, match="only before the first plan"):
        s.restore_disk_pages(slots, keys, parents, depths, tokens)


def test_restore_checks_shapes_and_needs_a_disk_tier():
    s = disk_scheduler()
    with pytest.raises(ValueError, match="tokens"):
        s.restore_disk_pages(np.ones(2, np.int32), np.ones(2, np.uint64), np.ones(2, np.uint64),
                             np.ones(2, np.int32), np.ones((2, PAGE + 1), np.int32))
    with pytest.raises(ValueError, match="no disk tier"):
        make_scheduler(page_size=PAGE).restore_disk_pages(
            np.ones(0, np.int32), np.ones(0, np.uint64), np.ones(0, np.uint64), np.ones(0, np.int32),
            np.ones((0, PAGE), np.int32))


def test_failed_writes_and_stop_leave_serving_alone():
    s = disk_scheduler()
    s.submit(spec("a", range(10, 27), max_new_tokens=3))
    run(s, fail_writes=True)
    stats = s.stats()
    # A failed page is tried again when its request finishes (the error may pass), then stays off disk.
    assert stats["disk_write_failures"] >= 4 and stats["cached_disk_pages"] == 0
    s.stop_disk_writes()
    records = []
    s.submit(spec("b", range(100, 117), max_new_tokens=3))
    run(s, records)
    assert records == [] and s.stats()["disk_writes_stopped"]


def test_disk_done_rejects_bad_rows_and_double_acks():
    s = disk_scheduler()
    s.submit(spec("a", range(10, 27), max_new_tokens=2))
    for _ in range(50):
        plan = s.next_plan()
        s.advance(plan, samples(plan))
        if plan.has_copies:
            s.copies_done(plan.step_id)
        if plan.has_disk_ops:
            with pytest.raises(ValueError, match="outside"):
                s.disk_done(plan.step_id, failed_writes=[99])
            s.disk_done(plan.step_id)
            with pytest.raises(ValueError, match="no unacknowledged disk ops"):
                s.disk_done(plan.step_id)
            return
    raise AssertionError("no disk ops planned")


def test_config_validation():
    with pytest.raises(ValueError, match="needs a host tier"):
        make_scheduler(num_host_pages=0, num_disk_pages=8)
    with pytest.raises(ValueError, match="num_disk_pages"):
        make_scheduler(num_disk_pages=1)
