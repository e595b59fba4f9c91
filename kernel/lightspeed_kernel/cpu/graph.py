"""Native graphs: record the native CPU kernel calls of one forward once, replay them without the
Python in between (the CPU counterpart of a CUDA graph).

Design note. An eager decode step of a small model is ~250 native calls whose arguments take
microseconds of Python each to compute (module calls, op dispatch, launcher checks): as much time
as the kernels themselves. The calls of a decode step depend only on shapes, and the kernels read
their inputs through pointers, so the list of (function, arguments) of one step, with every
tensor it touches kept alive at its address, is the whole step. `record()` runs a forward eagerly
(its results are real) and collects that list; `NativeGraph.replay()` calls it again. The caller
refreshes the inputs in place between replays (static input buffers, as for CUDA graphs).

Replay is only valid if every computing op of the recorded forward was a native call: a torch op
that computes (anything but allocations, views and aliasing no-ops) would not be replayed. A
dispatch mode watches the recording and `record()` raises `GraphCaptureError` naming such ops.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import native

# aten ops that allocate or give views: no computation to replay
_STRUCTURAL = {
    "empty", "empty_like", "empty_strided", "view", "_unsafe_view", "slice", "split", "split_with_sizes",
    "select", "alias", "t", "transpose", "permute", "as_strided", "expand", "unsqueeze", "squeeze", "detach",
    "narrow", "unflatten", "lift_fresh", "unbind",
}
# ops that are free when they return (a view of) their input, and a copy otherwise
_ALIASING = {"to", "contiguous", "reshape", "flatten", "_to_copy"}
# reads whose result only feeds Python-side checks (bounds of embedding rows): nothing to replay
_HOST_READS = {"item", "_local_scalar_dense", "min", "max", "equal", "is_nonzero"}


class GraphCaptureError(RuntimeError):
    """The recorded forward ran a computing torch op that a replay would skip."""


class NativeGraph:
    """The native calls of one recorded forward, and every tensor they touch (kept alive)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, tuple]] = []
        self.tensors: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self.calls)

    def replay(self) -> None:
        for fn, args in self.calls:
            status = fn(*args)
            if status:
                raise RuntimeError(f"native kernel {fn.__name__} failed in a graph replay (status {status})")


def _storage(t) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


class _Watch(TorchDispatchMode):
    """Keeps every tensor the forward creates alive and notes the ops a replay would miss."""

    def __init__(self, graph: NativeGraph):
        super().__init__()
        self.graph, self.violations = graph, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _ALIASING:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if _storage(out) != _storage(first):
                self.violations.append(str(func))
        elif name not in _STRUCTURAL and name not in _HOST_READS:
            self.violations.append(str(func))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.graph.tensors.append(t)
        return out


@contextlib.contextmanager
def record() -> Iterator[NativeGraph]:
    """Record the native calls made inside the block (which runs normally) into a NativeGraph;
    GraphCaptureError at exit when the block also computed with torch ops."""
    graph = NativeGraph()
    token = native.RECORDING.set(graph.calls)
    watch = _Watch(graph)
    try:
        with watch:
            yield graph
    finally:
        native.RECORDING.reset(token)
    if watch.violations:
        shown = ", ".join(sorted(set(watch.violations))[:5])
        raise GraphCaptureError(f"the recorded forward computed with torch ops a replay would skip: {shown}")
