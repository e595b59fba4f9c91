"""Expert load of a MoE model: tokens routed to each expert, read without stalling the step loop.

Every `FusedMoE` layer adds its routing to a device counter `[E]` inside the forward (CUDA-graph
safe). Reading them would sync the device, so at most every `interval_s` the summed counters are
copied to pinned host memory with a non-blocking copy and an event; `latest()` returns the last
copy that has landed. When each rank routes only its token shard (sequence parallelism,
data-parallel attention), the group's counters are reduced to rank 0 first (`needs_reduce`).
"""

from __future__ import annotations

import time

import torch

from ..layers.moe import FusedMoE

INTERVAL_S = 1.0


class ExpertLoad:
    def __init__(self, model: torch.nn.Module, device: torch.device, interval_s: float = INTERVAL_S):
        self.layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
        self.device, self.interval_s = device, interval_s
        self.needs_reduce = any(m.tokens_sharded for m in self.layers)
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._latest: list[int] | None = None
        self._last = 0.0

    def due(self) -> bool:
        return bool(self.layers) and time.monotonic() - self._last >= self.interval_s

    def local_total(self) -> torch.Tensor:
        """This rank's counters summed over layers, int64 [E] on the device."""
        return torch.stack([m.expert_load for m in self.layers]).sum(dim=0)

    def refresh(self, total: torch.Tensor | None = None) -> None:
        """Start copying `total` (default: this rank's counters) to the host."""
        self._collect()
        total = self.local_total() if total is None else total
        self._last = time.monotonic()
        if self.device.type != "cuda":
            self._latest = total.tolist()
            return
        if self._host is None:
            self._host = torch.empty(total.shape, dtype=total.dtype, pin_memory=True)
        self._host.copy_(total, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()

    def _collect(self) -> None:
        if self._event is not None and self._event.query():
            self._latest, self._event = self._host.tolist(), None

    def latest(self) -> list[int] | None:
        """Tokens routed to each expert so far (summed over MoE layers), as of the last copy; None
        for dense models or before the first copy lands."""
        self._collect()
        return self._latest
