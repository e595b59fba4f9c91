"""What a failure in the engine core costs: one request, one step's requests, or the core.

Design note. The core serves many requests from one loop, so an exception must be charged to the
smallest thing it belongs to:
- a request's own state (its sampling-table rows, its grammar matcher, its admission) fails that
  request only; the runner catches those where the per-request work happens and reports the
  request id (`ModelRunner.take_failures`);
- a step that raises as a whole (an exception in the forward or the sampler that no single request
  owns) fails the requests of that plan: `StepGuard.launch` stands in a zero token for each of their
  rows, so the scheduler advances the plan as usual and voids those rows (the requests are aborted
  first), and the loop carries on. A step that keeps failing is no longer one batch's problem: after
  `max_consecutive` failed steps in a row the error is treated as fatal;
- a fatal error (the device is lost: CUDA errors leave the context unusable; the scheduler's own
  invariants; any failure of a step that several tensor/expert-parallel ranks run, a dead rank
  included: `FatalEngineError`) ends the core, which reports `EngineFailure`; the gateway's
  supervisor restarts it (with fresh ranks: the old ones die with their core).

A request that fails finishes with reason "error"; its client gets the message (never a traceback,
which goes to the log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from ..kv import KVTransferError
from ..runner.model_runner import LaunchedStep, ModelRunner

log = logging.getLogger("lightspeed.core")

# Words of errors after which the device (or the collective it is part of) cannot be trusted.
_FATAL_MARKERS = ("CUDA error", "CUDA driver", "cudaError", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error",
                  "NCCL", "device-side assert", "illegal memory access", "ECC error", "HIP error")


class FatalEngineError(RuntimeError):
    """An error after which the engine core cannot serve anyone, whatever its words: e.g. a step of
    several ranks that failed on one of them leaves the others inside that step's collectives, so
    no later step would line up with theirs. `reason`: one line for the client (no internals)."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason


def is_fatal(error: BaseException) -> bool:
    """True when `error` leaves the engine unable to serve anyone (then the core exits)."""
    if not isinstance(error, Exception) or isinstance(error, (FatalEngineError, KVTransferError)):  # also ^C
        return True
    if isinstance(error, torch.OutOfMemoryError):  # the allocator recovers: fail the step, not the core
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    text = str(error)
    return any(marker in text for marker in _FATAL_MARKERS)


def request_error_message(error: BaseException) -> str:
    """What the client of a failed request is told: the kind of error, never a traceback."""
    if isinstance(error, ValueError):
        return str(error)
    if isinstance(error, torch.OutOfMemoryError):
        return "the engine ran out of device memory while running this request"
    return f"internal error in the engine while running this request ({type(error).__name__})"


class StepGuard:
    """Launches plans so that a non-fatal failure costs the plan's requests, not the engine core."""

    def __init__(self, runner: ModelRunner, fail: Callable[[list[int], str], None], max_consecutive: int = 3):
        self.runner = runner
        self._fail = fail              # (scheduler request ids, message): aborts and reports them
        self.max_consecutive = max_consecutive
        self._consecutive = 0
        self.num_failed_steps = 0

    def launch(self, plan) -> LaunchedStep:
        self.settle()  # failures the runner met while collecting the previous step
        try:
            launched = self.runner.launch(plan)
        except Exception as error:
            return self._stand_in(plan, error)
        if plan.num_reqs:  # a plan with rows ran: the failures were not here to stay
            self._consecutive = 0
        self.settle()
        return launched

    def settle(self) -> None:
        """Fail the requests whose own state failed in the runner (binding rows, grammar matchers)."""
        for req_id, error in self.runner.take_failures():
            if is_fatal(error):
                raise error
            log.warning("request %d failed: %s", req_id, error, exc_info=error)
            self._fail([req_id], request_error_message(error))

    def _stand_in(self, plan, error: Exception) -> LaunchedStep:
        self._consecutive += 1
        self.num_failed_steps += 1
        if is_fatal(error) or self._consecutive >= self.max_consecutive:
            raise error
        log.error("step %d failed; its %d requests fail, the engine carries on", int(plan.step_id),
                  int(plan.num_reqs), exc_info=error)
        if isinstance(error, torch.OutOfMemoryError) and torch.cuda.is_available():
            torch.cuda.empty_cache()
        req_ids = np.unique(np.asarray(plan.req_ids, dtype=np.int64)).tolist()
        self._fail(req_ids, request_error_message(error))
        # The rows of aborted requests are void in advance(): any token will do for them.
        sampled = plan.req_ids[plan.sample_batch_rows].astype(np.int64)
        # Speculative decode rows (several samples) need an accepted count each: one will do.
        nd = int(plan.num_decodes)
        accepted = np.ones(nd, np.int32) if nd and int(plan.num_decode_tokens) > nd else None
        return LaunchedStep(int(plan.step_id), sampled, torch.zeros(len(sampled), dtype=torch.int32),
                            accepted_counts=accepted)
