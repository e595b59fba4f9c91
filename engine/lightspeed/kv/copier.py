"""Page copies between the device KV pool and the host pool, off the step loop's critical path.

Design note. The engine hands each plan's copies (`write_back` device->host and `load_back`
host->device) to a copier and later learns which plans' copies have landed by polling; nothing in
the step loop waits for a copy unless the plan says its forward must (`forward_waits_for_copies`).
The scheduler keeps every page of an unacknowledged copy owned, so a copy in flight never races a
forward (see scheduler/README.md, "Copies").

- GPU (`CudaPageCopier`): two copy streams, one per direction (write-back device->host, load-back
  host->device), so the driver can put them on two copy engines and a load-back that a waiting
  request needs never queues behind the write-through's megabytes. The two directions touch
  disjoint pages: a load-back reads landed host copies and writes pages no copy in flight reads
  (the scheduler's quarantine and ownership rules). Before a plan's copies each stream waits for
  the compute stream, i.e. for every forward enqueued so far, so a copy never reads KV still being
  written nor writes a page an earlier forward still touches. Each run of consecutive pages is one
  `cudaMemcpy2DAsync` per pool tensor, straight between device memory and the pinned host pool: no
  staging buffer and no CPU work proportional to the bytes moved (the old path gathered through
  pageable memory and a CPU `index_copy_`, 88% of the engine core's time under load). An event
  after each direction's copies is queried each step; a plan's copies have landed when both have
  fired. A copy engine serves the copies queued on it in order, whatever their stream, so a small
  device->host copy another stream needs (a step's tokens in `stream` step IO) must be queued
  before a prompt's pages (~130 MB and 3.3 ms over PCIe for 1K tokens of an 8B), not behind them:
  `copy_after`. (Cutting runs into pieces does not help: all the pieces are queued at once.)
- CPU (`ThreadPageCopier`): one worker thread runs the same copies with torch index ops (which
  release the GIL); a future's `done()` is the event.

Pools are anything with `page_tensors`: tensors whose dim 1 is the page axis (the MHA pool is one
`[2L, pages, page_size, Hkv, D]` tensor; an MLA pool may hold several), identical between the two
tiers except for the page count.
"""

from __future__ import annotations

import ctypes
import logging
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np
import torch

log = logging.getLogger("lightspeed.kv")


class KVTransferError(RuntimeError):
    """A plan's KV copies or disk ops could not be handed to their workers. The scheduler waits for
    an acknowledgement of each plan's copies, and after a partial hand-over nobody knows which pages
    moved: the engine cannot go on (the core exits; a supervisor restarts it)."""


class PagedPool(Protocol):
    num_pages: int
    page_tensors: list[torch.Tensor]  # page axis at dim 1


def page_runs(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst) page pairs int [N, 2] -> runs (src_start, dst_start, length) where both sides are
    consecutive, so each run is one contiguous span per layer."""
    if pairs.shape[0] == 0:
        empty = np.empty(0, np.int64)
        return empty, empty, empty
    p = pairs[np.argsort(pairs[:, 0], kind="stable")].astype(np.int64)
    starts = np.ones(p.shape[0], dtype=bool)
    starts[1:] = (np.diff(p[:, 0]) != 1) | (np.diff(p[:, 1]) != 1)
    first = np.flatnonzero(starts)
    lengths = np.diff(np.append(first, p.shape[0]))
    return p[first, 0], p[first, 1], lengths


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def copy_pages(src: PagedPool, dst: PagedPool, src_pages: torch.Tensor, dst_pages: torch.Tensor) -> None:
    """dst page dst_pages[i] <- src page src_pages[i] in every page tensor, synchronously (CPU copier
    and tests). Raw bits through a same-width integer view: exact, and fp8 has no CPU index_copy."""
    if len(src.page_tensors) != len(dst.page_tensors) or any(
            a.dtype != b.dtype or a.shape[:1] + a.shape[2:] != b.shape[:1] + b.shape[2:]
            for a, b in zip(src.page_tensors, dst.page_tensors, strict=True)):
        raise ValueError("KV pools differ in layout: "
                         f"{[tuple(t.shape) for t in src.page_tensors]} vs {[tuple(t.shape) for t in dst.page_tensors]}")
    if src_pages.shape != dst_pages.shape:
        raise ValueError(f"page lists differ in length: {tuple(src_pages.shape)} vs {tuple(dst_pages.shape)}")
    if src_pages.numel() == 0:
        return
    for s, d in zip(src.page_tensors, dst.page_tensors, strict=True):
        s_bits, d_bits = s.view(_INT_OF_WIDTH[s.element_size()]), d.view(_INT_OF_WIDTH[d.element_size()])
        gathered = s_bits.index_select(1, src_pages.to(s.device))
        d_bits.index_copy_(1, dst_pages.to(d.device), gathered.to(d.device))


class PageCopier(ABC):
    """Runs plans' copies asynchronously; `poll()` names the plans whose copies have landed."""

    def __init__(self, device_pool: PagedPool, host_pool: PagedPool | None):
        self.device_pool, self.host_pool = device_pool, host_pool
        self._in_flight: deque[tuple[int, object]] = deque()  # (step_id, completion handle), in order
        self.pages_written = 0  # device -> host pages submitted so far (metrics)
        self.pages_loaded = 0   # host -> device

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def submit(self, step_id: int, write_back: np.ndarray, load_back: np.ndarray, forward_waits: bool) -> None:
        """Start a plan's copies: write_back int [M, 2] (device, host) and load_back int [N, 2]
        (host, device). With forward_waits, work submitted to the compute side afterwards starts
        only once the write-backs are done (a retraction's: the forward may reuse the pages they read)."""
        if (write_back.shape[0] or load_back.shape[0]) and self.host_pool is None:
            raise RuntimeError("the plan copies pages but there is no host KV tier")
        self._in_flight.append((step_id, self._start(write_back, load_back, forward_waits)))
        self.pages_written += write_back.shape[0]
        self.pages_loaded += load_back.shape[0]

    def poll(self) -> list[int]:
        """Steps whose copies have landed, oldest first (each direction's copies complete in submission
        order, so a plan's have landed only once every earlier plan's have)."""
        done = []
        while self._in_flight and self._is_done(self._in_flight[0][1]):
            done.append(self._in_flight.popleft()[0])
        return done

    def wait_all(self) -> list[int]:
        """Block until every copy in flight has landed (shutdown and tests); their steps."""
        done = []
        while self._in_flight:
            step_id, handle = self._in_flight.popleft()
            self._wait(handle)
            done.append(step_id)
        return done

    def retire(self, step_ids: list[int]) -> None:
        """Tensor parallelism: rank 0 learned these steps' copies landed (its own) and may hand their
        pages to the next plans, so this rank orders all later work after its copies of the same
        steps (a stream wait on GPU, a join on CPU) and forgets them. Steps retire in order."""
        wanted = set(step_ids)
        while self._in_flight and self._in_flight[0][0] in wanted:
            self._order_after(self._in_flight.popleft()[1])

    @abstractmethod
    def _order_after(self, handle: object) -> None:
        """Work submitted after this call starts only once the copies of `handle` are done."""

    @abstractmethod
    def _start(self, write_back: np.ndarray, load_back: np.ndarray, forward_waits: bool) -> object:
        """Start the copies; returns the handle `_is_done` / `_wait` take."""

    @abstractmethod
    def _is_done(self, handle: object) -> bool: ...

    @abstractmethod
    def _wait(self, handle: object) -> None: ...


class ThreadPageCopier(PageCopier):
    """CPU pools: copies on one worker thread, in submission order."""

    def __init__(self, device_pool: PagedPool, host_pool: PagedPool | None):
        super().__init__(device_pool, host_pool)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-copier")

    def _start(self, write_back, load_back, forward_waits) -> Future:
        # The plan's arrays are views into a buffer the plan after next overwrites: copy them.
        wb, lb = torch.from_numpy(np.array(write_back, np.int64)), torch.from_numpy(np.array(load_back, np.int64))

        def run() -> None:
            if wb.shape[0]:
                copy_pages(self.device_pool, self.host_pool, wb[:, 0], wb[:, 1])
            if lb.shape[0]:
                copy_pages(self.host_pool, self.device_pool, lb[:, 0], lb[:, 1])

        future = self._worker.submit(run)
        if forward_waits:
            future.result()  # the next forward runs on this thread, right after
        return future

    def _is_done(self, handle: Future) -> bool:
        if handle.done():
            handle.result()  # re-raise a failed copy
            return True
        return False

    def _wait(self, handle: Future) -> None:
        handle.result()

    def _order_after(self, handle: Future) -> None:
        handle.result()  # the forward runs on the calling thread


class CudaPageCopier(PageCopier):
    """CUDA device pool, pinned host pool: DMA on a copy stream per direction, completion by event query."""

    def __init__(self, device_pool: PagedPool, host_pool: PagedPool | None, device: torch.device):
        super().__init__(device_pool, host_pool)
        self.device = device
        self.write_stream = torch.cuda.Stream(device)  # device -> host
        self.load_stream = torch.cuda.Stream(device)   # host -> device
        # Streams whose queued work the copies also wait for (`copy_after`): the runner's result stream.
        self.after_streams: list[torch.cuda.Stream] = []
        self._memcpy2d = _cuda_memcpy_2d()
        if self._memcpy2d is None:
            log.warning("libcudart not found: KV page copies fall back to one torch copy per layer and run")

    def copy_after(self, stream: torch.cuda.Stream) -> None:
        """Start each plan's copies only after the work queued on `stream` so far, as after the compute
        stream's. The runner names its result stream: a copy engine serves its queue in order, whatever the
        stream, and a plan's write-through becomes ready when the step before it ends, just as that step's token
        copy does. Queued first, a prompt's pages (~130 MB) held the token copy a median 7.3 ms in a quarter of an
        H100's steps (bench/results/step_io_2026-12-07_1640_h100/); queued after it, they should not hold it."""
        self.after_streams.append(stream)

    def _start(self, write_back, load_back, forward_waits) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        compute = torch.cuda.current_stream(self.device)
        done = []
        for stream, src, dst, pairs in ((self.write_stream, self.device_pool, self.host_pool, write_back),
                                        (self.load_stream, self.host_pool, self.device_pool, load_back)):
            stream.wait_stream(compute)
            for after in self.after_streams if stream is self.write_stream else ():  # same direction
                stream.wait_stream(after)
            with torch.cuda.stream(stream):
                self._copy(src, dst, pairs, stream)
                done.append(stream.record_event())
        if forward_waits:  # a retraction freed the pages the write-back reads; load-backs need no wait
            compute.wait_event(done[0])
        return done[0], done[1]

    def _copy(self, src: PagedPool, dst: PagedPool, pairs: np.ndarray, on: torch.cuda.Stream) -> None:
        src_starts, dst_starts, lengths = page_runs(pairs)
        if lengths.shape[0] == 0:
            return
        stream = on.cuda_stream
        for s, d in zip(src.page_tensors, dst.page_tensors, strict=True):
            outer = s.shape[0]
            page_bytes = s[0, 0].numel() * s.element_size()   # one page of one outer index
            s_pitch, d_pitch = s.shape[1] * page_bytes, d.shape[1] * page_bytes
            s_base, d_base = s.data_ptr(), d.data_ptr()
            for a, b, n in zip(src_starts.tolist(), dst_starts.tolist(), lengths.tolist(), strict=True):
                if self._memcpy2d is not None:
                    self._memcpy2d(d_base + b * page_bytes, d_pitch, s_base + a * page_bytes, s_pitch,
                                   n * page_bytes, outer, stream)
                else:
                    d[:, b:b + n].copy_(s[:, a:a + n], non_blocking=True)

    def _is_done(self, handle: tuple[torch.cuda.Event, torch.cuda.Event]) -> bool:
        return all(event.query() for event in handle)

    def _wait(self, handle: tuple[torch.cuda.Event, torch.cuda.Event]) -> None:
        for event in handle:
            event.synchronize()

    def _order_after(self, handle: tuple[torch.cuda.Event, torch.cuda.Event]) -> None:
        for event in handle:
            torch.cuda.current_stream(self.device).wait_event(event)


_CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: direction from the pointers (unified addressing)


def _cuda_memcpy_2d():
    """cudaMemcpy2DAsync from the CUDA runtime torch already loaded, as a checked callable; None when
    it cannot be found. (torch exposes no strided host<->device DMA: its copy_ of a strided view
    stages through contiguous temporaries and a synchronous CPU copy.)"""
    lib = _load_cudart()
    if lib is None:
        return None
    fn = lib.cudaMemcpy2DAsync
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                   ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    error_string = lib.cudaGetErrorString
    error_string.restype = ctypes.c_char_p
    error_string.argtypes = [ctypes.c_int]

    def memcpy_2d(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, stream: int):
        code = fn(dst, dst_pitch, src, src_pitch, width, height, _CUDA_MEMCPY_DEFAULT, stream)
        if code != 0:
            raise RuntimeError(f"cudaMemcpy2DAsync failed: {error_string(code).decode()} ({code})")

    return memcpy_2d


def _load_cudart() -> ctypes.CDLL | None:
    # The copy already mapped into this process (torch's), else the usual sonames.
    candidates = []
    try:
        with open("/proc/self/maps") as maps:
            candidates += sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
    except OSError:
        pass
    major = (torch.version.cuda or "").split(".")[0]
    candidates += [f"libcudart.so.{major}"] if major else []
    candidates += ["libcudart.so"]
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def make_copier(device_pool: PagedPool, host_pool: PagedPool | None, device: torch.device) -> PageCopier:
    if device.type == "cuda":
        return CudaPageCopier(device_pool, host_pool, device)
    return ThreadPageCopier(device_pool, host_pool)
