"""A step's small transfers between host and GPU: its packed inputs up, its sampled tokens (and logprobs,
speculative verdicts) down. `LIGHTSPEED_STEP_IO` picks how they move:

- `kernel` (default): a Triton kernel on the compute stream moves the bytes through pinned host memory, which
  the GPU addresses directly (`lightspeed_kernel.ops.host_copy`). No copy engine is involved. Served on an H100
  against `stream` (bench/results/step_io_served_2026-12-07_2145_h100/), it gave 1.1% more output tokens at
  random 1024/128 c = 128 (three runs against four, ranges apart), TPOT 19.0 against 19.3 ms, and the same
  figures at c = 1.
  Where its start-up probe fails (no mapped pinned memory, no Triton) the runner uses `stream` and says so.
- `stream`: copy-engine copies; the results on a stream of their own.
- `compute`: copy-engine copies on the compute stream (the first design, kept for A/B runs).

Why not the copy engine. It runs its copies in the order they were queued, whatever their stream. The KV host
tier's write-through queues copies of megabytes there (a 1K-token prompt of the 8B shape is ~130 MB), and a
step's token copy queued behind them waited 4-8 ms. On the compute stream (`compute`), every kernel after it
waited too: the GPU sat idle 10.8% of a 64-row decode step on an H100
(bench/results/profile_gpu_2026-12-07_1427_h100/). On a stream of its own (`stream`) the GPU runs on, but the
host still waits for the tokens, so it launches the step after next late: in 15 of 61 steps the token copy
queued behind write-through copies (median 7.3 ms), and the compute stream sat idle 6.9% of a step waiting for
the host (bench/results/step_io_2026-12-07_1640_h100/). A kernel's transfer waits only for the kernels before it.

Pinned host blocks come from torch's caching host allocator, in every mode. A new block is a `cudaHostAlloc`,
which seems to wait for the device, copies included: the GPU tests' first run saw transfers whose results were
allocated while a 1 GiB copy ran land after it. In steady state the blocks of collected steps are reused.

On CPU the results are the host tensors themselves and there is no event.
"""

from __future__ import annotations

import logging
from collections import deque

import torch

from ..envs import STEP_IO_MODES

log = logging.getLogger("lightspeed.runner")


def kernel_transfer_problem(device: torch.device) -> str | None:
    """Why `kernel` transfers cannot run on `device` (None: they can). One small round trip, checked."""
    from lightspeed_kernel import ops, platform_of, select_kernel

    if select_kernel("memory", "host_copy", torch.uint8, platform=platform_of(device)).spec.solution == "reference":
        return "no kernel for memory/host_copy on this device (Triton missing?)"
    try:  # both builds the kernel has: 32-bit words, and bytes (odd sizes)
        for want in (torch.arange(1, 9, dtype=torch.int32), torch.arange(1, 8, dtype=torch.uint8)):
            host = torch.zeros_like(want).pin_memory()
            back = torch.zeros_like(want, device=device)
            ops.host_copy(want.to(device), host)
            ops.host_copy(host, back)
            torch.cuda.synchronize(device)
            if not (torch.equal(host, want) and torch.equal(back.cpu(), want)):
                return "the round trip through pinned memory returned other values"
    except Exception as e:  # a driver without mapped pinned memory, a Triton that rejects host pointers
        return f"{type(e).__name__}: {e}"
    return None


def resolve_step_io(device: torch.device, mode: str) -> str:
    """The mode the runner uses: `mode` on a GPU where it works, else the nearest that does."""
    if mode not in STEP_IO_MODES:
        raise ValueError(f"LIGHTSPEED_STEP_IO={mode!r}: choose one of {', '.join(STEP_IO_MODES)}")
    if device.type != "cuda":
        return "compute"  # CPU: nothing to move
    if mode == "kernel" and (problem := kernel_transfer_problem(device)) is not None:
        log.warning("step transfers through pinned memory do not work here (%s); using copy-engine copies on "
                    "their own stream", problem)
        return "stream"
    return mode


class PinnedInUse:
    """Pinned host tensors that queued kernels still read or write, each held until an event recorded after those
    kernels has fired. A copy-engine copy records its own event with torch's caching host allocator, which keeps
    the block from reuse until the copy ran; a kernel's access records nothing."""

    def __init__(self):
        self._held: deque[tuple[torch.cuda.Event, object]] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def release_done(self) -> None:
        while self._held and self._held[0][0].query():  # events fire in order: one stream
            self._held.popleft()

    def hold(self, event: torch.cuda.Event, tensors: object) -> None:
        self._held.append((event, tensors))


class PacketUploads:
    """A step packet's words (pinned on GPU) on the device, ordered before the step's kernels (`upload`).

    With `kernel` each packet's host words are held (`PinnedInUse`) until their read has run: a staging buffer
    replaced while a queued kernel still reads it (the builder grows its buffers) is not reused early."""

    def __init__(self, device: torch.device, mode: str):
        self.device, self.mode = device, mode
        self.reading = PinnedInUse()

    def upload(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return host
        if self.mode != "kernel":
            return host.to(self.device, non_blocking=True)
        from lightspeed_kernel import ops

        self.reading.release_done()
        dev = torch.empty(host.shape, dtype=host.dtype, device=self.device)
        ops.host_copy(host, dev)
        self.reading.hold(torch.cuda.current_stream(self.device).record_event(), host)
        return dev


class ResultCopies:
    """A step's results on the host and the event that says they landed, moved as `mode` says (module notes).

    `stream`: the copies wait for the compute stream's work so far, then run on their own stream; each source
    tensor is recorded there, so the caching allocator keeps it until its copy is done. `kernel`: the kernel runs
    on the compute stream, which orders its reads; the host tensors it writes are held (`PinnedInUse`) until their
    event fires, so a step dropped before it is collected cannot hand their pinned blocks out mid-write."""

    def __init__(self, device: torch.device, mode: str = STEP_IO_MODES[0]):
        self.device = device
        self.mode = resolve_step_io(device, mode)
        self.stream = torch.cuda.Stream(device) if self.mode == "stream" else None
        self._unfenced: list[torch.Tensor] = []  # written by kernels queued since the last event
        self.writing = PinnedInUse()

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """One tensor's host copy, valid once the event of a later `copy` of the same step has fired."""
        return self._enqueue([tensor])[0]

    def copy(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.cuda.Event | None]:
        """The tensors' host copies and the event after them (None on CPU); copies enqueued before on this
        object (`to_host`) have landed when it fires too."""
        host = self._enqueue(tensors)
        if self.device.type != "cuda":
            return host, None
        ready = torch.cuda.Event()
        ready.record(self.stream or torch.cuda.current_stream(self.device))
        if self.mode == "kernel":
            self.writing.hold(ready, self._unfenced)
            self._unfenced = []
        return host, ready

    def _enqueue(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.device.type != "cuda":
            return list(tensors)
        if self.mode == "compute":
            return [t.to("cpu", non_blocking=True) for t in tensors]
        if self.mode == "kernel":
            from lightspeed_kernel import ops

            self.writing.release_done()
            host = []
            for t in tensors:
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                ops.host_copy(t.contiguous(), h)
                host.append(h)
            self._unfenced += host
            return host
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for t in tensors:
                t.record_stream(self.stream)
            return [t.to("cpu", non_blocking=True) for t in tensors]
