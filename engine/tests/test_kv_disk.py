"""The disk KV tier's files: round trips of any pool's page tensors, the checks that keep a torn,
truncated, bit-flipped or foreign record from ever being served, the index rebuilt at start-up,
and a write error that stops writes while reads go on."""

from __future__ import annotations

import errno
import os
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightspeed.kv import KVLayout, KVPool, MLAKVPool, MLALayout
from lightspeed.kv.disk import DiskKVTier, kv_fingerprint

PAGE = 4
FP = kv_fingerprint({"test": 1})


def host_pool(dtype=torch.float32, pages: int = 8) -> KVPool:
    pool = KVPool(KVLayout(num_layers=2, num_kv_heads=2, head_dim=8, page_size=PAGE, dtype=dtype), pages, "cpu")
    pool.buffer.copy_(torch.randn(pool.buffer.shape).to(dtype))
    return pool


def plan(step: int, writes=(), reads=()) -> SimpleNamespace:
    """A plan's disk arrays. writes: (host page, slot, key, parent key, depth, first token);
    reads: (slot, host page, key, first token). A page's tokens are first..first+PAGE-1."""
    toks = lambda first: np.arange(first, first + PAGE, dtype=np.int32)  # noqa: E731
    return SimpleNamespace(
        step_id=step,
        disk_write=np.array([w[:2] for w in writes], np.int32).reshape(-1, 2),
        disk_write_keys=np.array([w[2:5] for w in writes], np.uint64).reshape(-1, 3),
        disk_write_tokens=np.array([toks(w[5]) for w in writes], np.int32).reshape(-1, PAGE),
        disk_read=np.array([r[:2] for r in reads], np.int32).reshape(-1, 2),
        disk_read_keys=np.array([r[2] for r in reads], np.uint64).reshape(-1),
        disk_read_tokens=np.array([toks(r[3]) for r in reads], np.int32).reshape(-1, PAGE))


def run(tier: DiskKVTier, p) -> tuple[list[int], list[int]]:
    tier.submit(p)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for step, failed_writes, failed_reads in tier.poll():
            assert step == p.step_id
            return failed_writes, failed_reads
        time.sleep(0.001)
    raise AssertionError("disk ops never finished")


def index_of(pool, path):
    """What a restarted engine finds in `path`."""
    tier = DiskKVTier(pool, path, 1 << 20, FP, PAGE)
    try:
        return tier.load_index()
    finally:
        tier.close()


def page(pool, p: int) -> list[torch.Tensor]:
    return [t[:, p].clone() for t in pool.page_tensors]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b, strict=True))


# Three chained pages written from host pages 1..3 to slots 5, 6, 2 (keys 11 -> 12 -> 13).
WRITES = [(1, 5, 11, 99, 1, 100), (2, 6, 12, 11, 2, 200), (3, 2, 13, 12, 3, 300)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_write_then_read_back_bit_exact(tmp_path, dtype):
    pool = host_pool(dtype)
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    before = [page(pool, p) for p in (1, 2, 3)]
    assert run(tier, plan(1, writes=WRITES)) == ([], [])
    pool.buffer[:, 4:7].zero_()
    assert run(tier, plan(2, reads=[(5, 4, 11, 100), (6, 5, 12, 200), (2, 6, 13, 300)])) == ([], [])
    for p, expected in zip((4, 5, 6), before, strict=True):
        assert same(page(pool, p), expected)
    assert tier.stats.pages_written == 3 and tier.stats.pages_read == 3
    assert tier.stats.bytes_read == 3 * tier.payload_bytes == 3 * pool.layout.bytes_per_page
    tier.close()


def test_mla_pool_with_several_page_tensors(tmp_path):
    pool = MLAKVPool(MLALayout(num_layers=2, page_size=PAGE, dtype=torch.float8_e4m3fn), 6, "cpu")
    for t in pool.page_tensors:  # latent e4m3, its scale per token (fp32), rope (bf16)
        t.copy_(torch.randn(t.shape).to(t.dtype))
    assert len(pool.page_tensors) == 3
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    before = page(pool, 2)
    assert run(tier, plan(1, writes=[(2, 1, 7, 99, 1, 0)])) == ([], [])
    assert run(tier, plan(2, reads=[(1, 5, 7, 0)])) == ([], [])
    assert same(page(pool, 5), before)
    assert tier.payload_bytes == pool.bytes_per_page


def test_reads_check_key_tokens_and_payload(tmp_path):
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    run(tier, plan(1, writes=WRITES))
    # Another key, other tokens, a slot never written: failed reads, never served.
    failed = run(tier, plan(2, reads=[(5, 4, 12, 100), (6, 5, 12, 201), (9, 6, 13, 300), (2, 7, 13, 300)]))
    assert failed == ([], [0, 1, 2])
    assert tier.stats.failures_by_reason == {"other page": 2, "bad entry": 1}
    # A flipped bit in slot 2's payload: caught by the checksum.
    offset = 2 * tier.record_bytes + 17
    with open(tier.data_path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))
    assert run(tier, plan(3, reads=[(2, 7, 13, 300)])) == ([], [0])
    assert tier.stats.failures_by_reason["checksum"] == 1
    # A record that failed a read is erased: a restart does not offer it again (slots 5, 6 and 2
    # all failed one); the record read back fine stays.
    run(tier, plan(4, writes=[(1, 7, 21, 99, 1, 500)]))
    tier.close()
    index = index_of(pool, tmp_path)
    assert index.slots.tolist() == [7]


def test_index_is_rebuilt_at_start_up_and_bad_entries_dropped(tmp_path):
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    run(tier, plan(1, writes=WRITES))
    tier.close()
    index = index_of(pool, tmp_path)
    assert index.slots.tolist() == [5, 6, 2]  # oldest first
    assert index.keys.tolist() == [11, 12, 13] and index.parent_keys.tolist() == [99, 11, 12]
    assert index.depths.tolist() == [1, 2, 3] and index.tokens[:, 0].tolist() == [100, 200, 300]
    assert index.num_rejected == 0
    # A bit flipped in slot 6's entry drops it; the rest stay.
    with open(tier.index_path, "r+b") as f:
        f.seek(4096 + 6 * tier.entry.itemsize + 20)
        f.write(b"\xff")
    index = index_of(pool, tmp_path)
    assert index.slots.tolist() == [5, 2] and index.num_rejected == 1


def test_truncated_files_lose_only_what_they_lost(tmp_path):
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    run(tier, plan(1, writes=WRITES))
    tier.close()
    os.truncate(tier.data_path, 6 * tier.record_bytes)  # slot 6's record is gone, slots 2 and 5 remain
    index = index_of(pool, tmp_path)
    assert index.slots.tolist() == [5, 2] and index.num_rejected == 1
    os.truncate(tier.index_path, 4096 + 3 * tier.entry.itemsize)  # only slots 0..2 have entries left
    index = index_of(pool, tmp_path)
    assert index.slots.tolist() == [2]
    os.truncate(tier.index_path, 100)  # the header itself: the files start afresh
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    assert tier.load_index().slots.tolist() == []  # and the lock of the last one was released
    assert run(tier, plan(2, reads=[(2, 4, 13, 300)])) == ([], [0])


def test_another_fingerprint_or_layout_never_shares_a_file(tmp_path):
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    run(tier, plan(1, writes=WRITES))
    other = DiskKVTier(pool, tmp_path, 1 << 20, kv_fingerprint({"test": 2}), PAGE)
    assert other.data_path != tier.data_path and other.load_index().slots.tolist() == []
    with pytest.raises(ValueError, match="in use by another engine"):
        DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    tier.close()
    wider = KVPool(KVLayout(2, 2, 16, PAGE, torch.float32), 8, "cpu")  # pages of another size
    assert index_of(wider, tmp_path).slots.tolist() == []  # same name, other layout: the files restart
    with pytest.raises(ValueError, match="holds no KV page"):
        DiskKVTier(pool, tmp_path / "small", 100, FP, PAGE)


def test_write_error_stops_writes_and_reads_go_on(tmp_path, monkeypatch):
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    run(tier, plan(1, writes=WRITES[:1]))
    real = os.pwritev

    def full(fd, buffers, offset):
        if fd == tier._data_fd:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", full)
    assert run(tier, plan(2, writes=WRITES[1:])) == ([0, 1], [])
    assert tier.writes_stopped and tier.stats.write_errors == 2
    monkeypatch.setattr(os, "pwritev", real)
    assert run(tier, plan(3, writes=WRITES[1:2])) == ([0], [])  # stopped for good, even with space back
    assert run(tier, plan(4, reads=[(5, 4, 11, 100)])) == ([], [])
    assert same(page(pool, 4), page(pool, 1))


def test_start_up_bound_leaves_the_rest_unread(tmp_path):
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    run(tier, plan(1, writes=WRITES))
    tier.close()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    index = tier.load_index(time_budget_s=-1.0)
    assert index.slots.tolist() == [] and index.num_unread == 3


def test_wait_any_waits_for_a_pending_op_not_a_finished_one(tmp_path, monkeypatch):
    # A step whose writes are done but whose read is not: the wait must last until the read lands
    # (returning at once on the done writes made the engine's step loop spin, starving the readers).
    pool = host_pool()
    tier = DiskKVTier(pool, tmp_path, 1 << 20, FP, PAGE)
    assert run(tier, plan(1, writes=WRITES[:1])) == ([], [])
    release, read_rows = threading.Event(), tier._read_rows

    def held_read(*args):
        release.wait(10)
        return read_rows(*args)

    monkeypatch.setattr(tier, "_read_rows", held_read)
    tier.submit(plan(2, writes=WRITES[1:2], reads=[(5, 4, 11, 100)]))
    write_futures = tier._in_flight[2][2]
    while not all(f.done() for f in write_futures):
        time.sleep(0.001)
    started = time.monotonic()
    tier.wait_any(0.3)
    assert time.monotonic() - started >= 0.25, "returned on the finished writes"
    threading.Timer(0.05, release.set).start()
    tier.wait_any(5.0)
    assert tier.poll() == [(2, [], [])]
    tier.close()
