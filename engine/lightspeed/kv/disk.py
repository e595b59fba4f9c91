"""The disk KV tier: host-pool pages <-> page records in one large file, off the step loop.

Design note. The scheduler decides what moves (plan.disk_write: host page -> slot, plan.disk_read:
slot -> host page) and owns every page and slot involved until `disk_done`; this module only moves
bytes and checks them. Two files in `--disk-cache-dir`, named by the KV fingerprint, so that two
models or settings never share a file and a foreign file is never even opened:

    lightspeed-kv-<fp>.data    slot s at offset s * record_bytes: the page's bytes, page tensor by
                               page tensor, outer index by outer index (as the host pool holds them)
    lightspeed-kv-<fp>.index   a header, then one fixed-size entry per slot: the page's key, its
                               parent's key, depth, write sequence number, token ids, the payload's
                               CRC-32 and the entry's own.

A write stores the payload, then its entry. A read checks the entry (magic, fingerprint, its CRC,
key and token ids equal to what the scheduler asked for) and the payload's CRC: a torn write, a
truncated or bit-flipped file, or a record of another page is a failed read (counted, its entry
erased, the page recomputed), never served. At start-up the index is read sequentially and each
entry checked, within a time bound; payloads are checked on every read instead, so start-up does not
read the data file. Reads and writes run on their own thread pools (reads never queue behind
writes) with os.preadv / os.pwritev straight between the file and the host pool's memory (they,
and zlib.crc32, release the GIL); `poll()` reports steps whose ops are all done, with the rows that
failed. The first write error (no space left, a quota, an I/O error) stops writes for good: the
engine tells the scheduler, and serving goes on, reads too.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import json
import logging
import os
import threading
import time
import weakref
import zlib
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("lightspeed.kv")

DISK_FORMAT_VERSION = 1
_MAGIC = 0x564B534C  # "LSKV"
_HEADER_MAGIC = b"LSKVIDX1"
_HEADER_BYTES = 4096
_ALIGN = 4096
_OPS_PER_TASK = 8       # pages one worker task moves: few futures per step, work spread over threads
_IOV_MAX = 1024


def default_disk_size(directory: str | Path) -> int:
    """The tier's size when none is given: half the free space of `directory`'s file system now."""
    os.makedirs(directory, exist_ok=True)
    fs = os.statvfs(directory)
    return fs.f_bavail * fs.f_frsize // 2


def kv_fingerprint(parts: dict) -> str:
    """Hex SHA-256 of everything that changes the KV bytes (canonical JSON of `parts`)."""
    blob = json.dumps({"format": DISK_FORMAT_VERSION, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def entry_dtype(page_size: int) -> np.dtype:
    """One index entry; `entry_crc` covers every byte before it."""
    return np.dtype([("magic", "<u4"), ("version", "<u2"), ("flags", "<u2"), ("fingerprint", "<u8"),
                     ("key", "<u8"), ("parent_key", "<u8"), ("depth", "<i4"), ("payload_crc", "<u4"),
                     ("seq", "<u8"), ("tokens", "<i4", (page_size,)), ("entry_crc", "<u4"), ("pad", "<u4")])


@dataclass
class DiskIndex:
    """Records found at start-up, oldest first (the scheduler's restore_disk_pages arguments)."""

    slots: np.ndarray        # int32 [N]
    keys: np.ndarray         # uint64 [N]
    parent_keys: np.ndarray  # uint64 [N]
    depths: np.ndarray       # int32 [N]
    tokens: np.ndarray       # int32 [N, page_size]
    num_rejected: int = 0    # entries that failed their checks (or lay past a truncated data file)
    num_unread: int = 0      # entries not looked at before the start-up time bound ran out


@dataclass
class DiskStats:
    """Counters of the disk tier (cumulative)."""

    pages_written: int = 0
    pages_read: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    write_errors: int = 0
    read_failures: int = 0            # records missing, torn or not the page asked for
    failures_by_reason: dict[str, int] = field(default_factory=dict)
    restored_pages: int = 0           # at start-up: records the scheduler took back
    rejected_records: int = 0         # at start-up: records that failed their checks or had no parent


class DiskKVTier:
    """Page records of one host pool in `directory`, at most `num_slots` of them (slot 0 unused)."""

    def __init__(self, host_pool, directory: str | Path, size_bytes: int, fingerprint: str, page_size: int, *,
                 read_threads: int = 4, write_threads: int = 2):
        self.host_pool, self.page_size, self.fingerprint = host_pool, page_size, fingerprint
        self.fingerprint_u64 = int(fingerprint[:16], 16)
        self.directory = Path(directory)
        self._views = [_page_byte_view(t) for t in host_pool.page_tensors]  # [outer, pages, bytes] each
        self.payload_bytes = sum(v.shape[0] * v.shape[2] for v in self._views)
        self.record_bytes = -(-self.payload_bytes // _ALIGN) * _ALIGN
        self.entry = entry_dtype(page_size)
        self.num_slots = 1 + size_bytes // (self.record_bytes + self.entry.itemsize)
        if self.num_slots < 2:
            raise ValueError(f"disk_cache_size={size_bytes} bytes holds no KV page ({self.record_bytes} bytes each)")
        self.directory.mkdir(parents=True, exist_ok=True)
        stem = self.directory / f"lightspeed-kv-{fingerprint[:16]}"
        self.data_path, self.index_path = stem.with_suffix(".data"), stem.with_suffix(".index")
        self._index_fd = os.open(self.index_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:  # one engine per file: another would overwrite this one's slots
            fcntl.flock(self._index_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._index_fd)
            raise ValueError(f"{self.index_path} is in use by another engine (one disk cache per engine)") from None
        self._data_fd = os.open(self.data_path, os.O_RDWR | os.O_CREAT, 0o644)
        if not self._header_matches():  # no files yet, or of another layout: start afresh
            self._reset_files()
        self._seq = itertools.count(1)
        self._stop = threading.Event()  # set on the first write error
        self._readers = ThreadPoolExecutor(read_threads, thread_name_prefix="kv-disk-read")
        self._writers = ThreadPoolExecutor(write_threads, thread_name_prefix="kv-disk-write")
        self._in_flight: dict[int, tuple[int, int, list[Future], list[Future]]] = {}
        self.stats = DiskStats()
        # Files and threads go with the tier even when close() is not called (its lock with them).
        self._finalizer = weakref.finalize(self, _release, self._readers, self._writers,
                                           (self._index_fd, self._data_fd))

    # -- start-up ----------------------------------------------------------------------------------
    def load_index(self, time_budget_s: float = 10.0) -> DiskIndex:
        """The records the files hold (none when they were started afresh: another layout). Entries
        are checked until the time budget runs out; the rest count as unread (their slots are reused)."""
        deadline = time.monotonic() + time_budget_s
        data_size = os.fstat(self._data_fd).st_size
        raw = self._read_entries()
        if data_size != self.num_slots * self.record_bytes:  # truncated, or another size asked for
            os.ftruncate(self._data_fd, self.num_slots * self.record_bytes)  # sparse: costs no space
        slots = np.arange(raw.shape[0], dtype=np.int32)
        plausible = ((raw["magic"] == _MAGIC) & (raw["version"] == DISK_FORMAT_VERSION)
                     & (raw["fingerprint"] == self.fingerprint_u64) & (slots >= 1))
        written = raw["magic"] != 0
        in_file = (slots.astype(np.int64) + 1) * self.record_bytes <= data_size  # a truncated data file
        candidates = np.flatnonzero(plausible & in_file)
        entry_bytes = raw.view(np.uint8).reshape(raw.shape[0], self.entry.itemsize) if raw.shape[0] else None
        keep, unread = [], 0
        for n, i in enumerate(candidates.tolist()):
            if n % 1024 == 0 and time.monotonic() > deadline:
                unread = len(candidates) - n
                break
            if zlib.crc32(entry_bytes[i, :-8]) == int(raw["entry_crc"][i]):
                keep.append(i)
        keep = np.array(keep, dtype=np.int64)
        rejected = int(written.sum()) - len(keep) - unread
        index = self._index_of(raw[keep], slots[keep], rejected, unread)
        self._seq = itertools.count(int(raw["seq"][keep].max()) + 1 if len(keep) else 1)
        return index

    def _index_of(self, entries: np.ndarray, slots: np.ndarray, rejected: int, unread: int) -> DiskIndex:
        order = np.argsort(entries["seq"], kind="stable")
        e = entries[order]
        return DiskIndex(slots[order].astype(np.int32), e["key"].astype(np.uint64), e["parent_key"].astype(np.uint64),
                         e["depth"].astype(np.int32), np.ascontiguousarray(e["tokens"], dtype=np.int32).reshape(
                             len(e), self.page_size), rejected, unread)

    def _header(self) -> bytes:
        meta = {"version": DISK_FORMAT_VERSION, "fingerprint": self.fingerprint, "page_size": self.page_size,
                "payload_bytes": self.payload_bytes, "record_bytes": self.record_bytes,
                "entry_bytes": self.entry.itemsize}
        blob = _HEADER_MAGIC + json.dumps(meta, sort_keys=True).encode()
        return blob.ljust(_HEADER_BYTES, b"\0")

    def _header_matches(self) -> bool:
        return os.pread(self._index_fd, _HEADER_BYTES, 0) == self._header()

    def _reset_files(self) -> None:
        for fd in (self._index_fd, self._data_fd):
            os.ftruncate(fd, 0)
        os.pwrite(self._index_fd, self._header(), 0)
        os.ftruncate(self._index_fd, _HEADER_BYTES + self.num_slots * self.entry.itemsize)
        os.ftruncate(self._data_fd, self.num_slots * self.record_bytes)

    def _read_entries(self) -> np.ndarray:
        """Every entry the index file holds, up to num_slots (a short file: fewer, all zero past it)."""
        size = self.num_slots * self.entry.itemsize
        buf = bytearray(size)
        view, done = memoryview(buf), 0
        while done < size:
            n = os.preadv(self._index_fd, [view[done:]], _HEADER_BYTES + done)
            if n <= 0:
                break
            done += n
        if os.fstat(self._index_fd).st_size != _HEADER_BYTES + size:
            os.ftruncate(self._index_fd, _HEADER_BYTES + size)
        return np.frombuffer(bytes(buf[: done - done % self.entry.itemsize]), dtype=self.entry)

    # -- asynchronous ops ----------------------------------------------------------------------------
    @property
    def writes_stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def submit(self, plan) -> None:
        """Start a plan's disk ops (plan.disk_write, plan.disk_read and their keys and tokens)."""
        # The plan's arrays are views into a buffer the plan after next overwrites: copy them.
        writes = (np.array(plan.disk_write), np.array(plan.disk_write_keys), np.array(plan.disk_write_tokens))
        reads = (np.array(plan.disk_read), np.array(plan.disk_read_keys), np.array(plan.disk_read_tokens))
        if self._stop.is_set():  # writes stopped since the scheduler planned these: none happen
            write_futures = [_done_future(list(range(writes[0].shape[0])))]
        else:
            write_futures = [self._writers.submit(self._write_rows, writes, rows)
                             for rows in _chunks(writes[0].shape[0])]
        read_futures = [self._readers.submit(self._read_rows, reads, rows) for rows in _chunks(reads[0].shape[0])]
        self._in_flight[int(plan.step_id)] = (writes[0].shape[0], reads[0].shape[0], write_futures, read_futures)

    def poll(self) -> list[tuple[int, list[int], list[int]]]:
        """(step_id, failed write rows, failed read rows) of each step whose disk ops are all done."""
        done = [s for s, (_, _, w, r) in self._in_flight.items() if all(f.done() for f in (*w, *r))]
        return [self._collect(s) for s in done]

    def wait_any(self, timeout_s: float) -> None:
        """Block until one op in flight is done, or timeout_s passed."""
        # Only the pending ones: a step's done futures would end the wait at once (FIRST_COMPLETED).
        pending = [f for (_, _, w, r) in self._in_flight.values() for f in (*w, *r) if not f.done()]
        if pending:
            wait(pending, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def wait_all(self) -> list[tuple[int, list[int], list[int]]]:
        """Block until every op in flight is done (shutdown and tests)."""
        return [self._collect(s) for s in list(self._in_flight)]

    def _collect(self, step_id: int) -> tuple[int, list[int], list[int]]:
        num_writes, num_reads, write_futures, read_futures = self._in_flight.pop(step_id)
        failed_writes = [row for f in write_futures for row in f.result()]
        failed_reads = [row for f in read_futures for row, _ in f.result()]
        for f in read_futures:
            for _, reason in f.result():
                self.stats.failures_by_reason[reason] = self.stats.failures_by_reason.get(reason, 0) + 1
        s = self.stats
        s.pages_written += num_writes - len(failed_writes)
        s.pages_read += num_reads - len(failed_reads)
        s.bytes_written += (num_writes - len(failed_writes)) * self.payload_bytes
        s.bytes_read += (num_reads - len(failed_reads)) * self.payload_bytes
        s.write_errors += len(failed_writes)
        s.read_failures += len(failed_reads)
        return step_id, failed_writes, failed_reads

    # -- worker threads ------------------------------------------------------------------------------
    def _page_buffers(self, page: int) -> list[memoryview]:
        return [memoryview(v[o, page]) for v in self._views for o in range(v.shape[0])]

    def _write_rows(self, writes, rows: range) -> list[int]:
        pages, keys, tokens = writes
        # Rows submitted before a failure are all tried (each fails on its own if the disk is full), so
        # which pages reach disk does not depend on how the writer threads interleave.
        failed = []
        for row in rows:
            try:
                self._write(int(pages[row, 0]), int(pages[row, 1]), keys[row], tokens[row])
            except OSError as e:
                failed.append(row)
                if not self._stop.is_set():
                    self._stop.set()
                    log.warning("disk KV tier: writes stopped (%s); serving goes on, reads too",
                                e.strerror or errno.errorcode.get(e.errno, e))
        return failed

    def _write(self, host_page: int, slot: int, key_parent_depth: np.ndarray, tokens: np.ndarray) -> None:
        buffers = self._page_buffers(host_page)
        crc = 0
        for b in buffers:
            crc = zlib.crc32(b, crc)
        _pwritev_all(self._data_fd, buffers, slot * self.record_bytes, self.payload_bytes)
        entry = np.zeros(1, self.entry)
        entry["magic"], entry["version"], entry["fingerprint"] = _MAGIC, DISK_FORMAT_VERSION, self.fingerprint_u64
        entry["key"], entry["parent_key"], entry["depth"] = key_parent_depth[0], key_parent_depth[1], key_parent_depth[2]
        entry["payload_crc"], entry["seq"], entry["tokens"] = crc, next(self._seq), tokens
        raw = entry.view(np.uint8)
        entry["entry_crc"] = zlib.crc32(raw[:-8])
        if os.pwrite(self._index_fd, entry.tobytes(), self._entry_offset(slot)) != self.entry.itemsize:
            raise OSError(errno.ENOSPC, "short write to the disk cache index")

    def _read_rows(self, reads, rows: range) -> list[tuple[int, str]]:
        slots_pages, keys, tokens = reads
        failed = []
        for row in rows:
            slot = int(slots_pages[row, 0])
            reason = self._read(slot, int(slots_pages[row, 1]), int(keys[row]), tokens[row])
            if reason is not None:
                failed.append((row, reason))
                self._erase_entry(slot)  # so that a restart does not offer it again
        return failed

    def _read(self, slot: int, host_page: int, key: int, tokens: np.ndarray) -> str | None:
        """None when the record was read into host_page and verified, else why not."""
        try:
            raw = os.pread(self._index_fd, self.entry.itemsize, self._entry_offset(slot))
            if len(raw) != self.entry.itemsize:
                return "truncated"
            entry = np.frombuffer(raw, self.entry)[0]
            if (entry["magic"] != _MAGIC or entry["version"] != DISK_FORMAT_VERSION
                    or entry["fingerprint"] != self.fingerprint_u64 or zlib.crc32(raw[:-8]) != entry["entry_crc"]):
                return "bad entry"
            if int(entry["key"]) != key or not np.array_equal(entry["tokens"], tokens):
                return "other page"
            buffers = self._page_buffers(host_page)
            if _preadv_all(self._data_fd, buffers, slot * self.record_bytes) != self.payload_bytes:
                return "truncated"
        except OSError as e:
            return f"read error ({e.strerror})"
        crc = 0
        for b in buffers:
            crc = zlib.crc32(b, crc)
        return None if crc == int(entry["payload_crc"]) else "checksum"

    def _erase_entry(self, slot: int) -> None:
        try:
            os.pwrite(self._index_fd, bytes(self.entry.itemsize), self._entry_offset(slot))
        except OSError:
            pass  # the entry fails its checks again after a restart: still never served

    def _entry_offset(self, slot: int) -> int:
        return _HEADER_BYTES + slot * self.entry.itemsize

    def close(self) -> None:
        """Wait for the workers and close the files (unacknowledged ops are abandoned)."""
        self._finalizer()


def _release(readers: ThreadPoolExecutor, writers: ThreadPoolExecutor, fds: tuple[int, ...]) -> None:
    readers.shutdown(wait=True)
    writers.shutdown(wait=True)
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _page_byte_view(t: torch.Tensor) -> np.ndarray:
    """A CPU page tensor [outer, pages, ...] as a uint8 array [outer, pages, bytes per page] (a view)."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("the disk tier needs contiguous CPU page tensors (the host pool)")
    outer, pages = t.shape[0], t.shape[1]
    flat = t.reshape(outer, pages, -1)
    if flat.shape[2] == 0:
        return np.zeros((outer, pages, 0), np.uint8)
    return flat.view(torch.uint8).numpy().reshape(outer, pages, -1)


def _done_future(result) -> Future:
    f = Future()
    f.set_result(result)
    return f


def _chunks(n: int) -> list[range]:
    return [range(i, min(i + _OPS_PER_TASK, n)) for i in range(0, n, _OPS_PER_TASK)]


def _pwritev_all(fd: int, buffers: list[memoryview], offset: int, total: int) -> None:
    if _vectored(os.pwritev, fd, buffers, offset) != total:
        raise OSError(errno.ENOSPC, "short write to the disk cache")


def _preadv_all(fd: int, buffers: list[memoryview], offset: int) -> int:
    return _vectored(os.preadv, fd, buffers, offset)


def _vectored(op, fd: int, buffers: list[memoryview], offset: int) -> int:
    """os.pwritev / os.preadv over any number of buffers (IOV_MAX per call); stops at a short one."""
    done = 0
    for i in range(0, len(buffers), _IOV_MAX):
        part = buffers[i:i + _IOV_MAX]
        n = op(fd, part, offset + done)
        done += n
        if n != sum(b.nbytes for b in part):
            break
    return done
