"""EngineClient: the gateway's one view of `lightspeed.AsyncLLM`.

It asks for delta outputs (only new text, tokens and logprobs per CompletionOutput), tracks in-flight
requests for admission control and engine-death handling, aborts requests whose consumer left or
whose time ran out (`request_timeout_s`: one timer per request, nothing per token), restarts a dead
engine when the supervisor asks, and reads liveness and the stats snapshot the metrics need.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("lightspeed.gateway")


class EngineDead(Exception):
    """The engine core is gone; the request cannot complete."""


class CoreDead(EngineDead):
    """The data-parallel engine core serving this request is gone; the other cores carry on."""


class RequestRejected(Exception):
    """The engine refused this request (e.g. a grammar it cannot compile); others carry on."""


class RequestFailed(Exception):
    """This request failed inside the engine (not its input's fault); the engine and others carry on."""


class RequestTimeout(Exception):
    """The request ran past request_timeout_s and was aborted."""


@dataclass
class RequestTiming:
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive outputs


def _engine_error_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(engine dead, request failed) exception types of the engine package."""
    try:
        from lightspeed import EngineDeadError, RequestFailedError
    except ImportError:
        return (EngineDead,), (RequestFailed,)
    return (EngineDead, EngineDeadError), (RequestFailed, RequestFailedError)


class EngineClient:
    """Wraps an AsyncLLM-like object (`generate`, `abort`, `shutdown`, `get_tokenizer`)."""

    def __init__(self, llm: Any, tokenizer: Any | None = None, log_requests: bool = False,
                 request_timeout_s: float = 600.0) -> None:
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else llm.get_tokenizer()
        info = llm.engine_info  # the core's Ready message: effective limits of this engine
        self.info = info
        self.max_model_len: int = int(info.max_model_len)
        self.page_size: int = int(info.page_size)
        # Ids the tokenizer can decode and the LM head can produce (the engine checked at start-up
        # that the tokenizer's ids fit the model's vocabulary).
        self.vocab_size: int = min(int(info.vocab_size), len(self.tokenizer))
        # Whether finished prompt pages stay in the engine's prefix cache (Anthropic usage reports them).
        self.prefix_cache: bool = bool(getattr(getattr(llm, "config", None), "enable_prefix_cache", True))
        # Widths of the engine's per-request tables: a request over them is a 400 here.
        config = getattr(llm, "config", None)
        self.max_logit_bias: int = int(getattr(config, "max_logit_bias", 1024))
        self.max_stop_token_ids: int = int(getattr(config, "max_stop_token_ids", 64))
        self.engine_pid: int | None = getattr(llm, "engine_pid", None)
        self.dead_reason: str | None = None
        self.given_up = False  # the supervisor will not restart the engine again
        self.num_restarts = 0
        # Data-parallel cores that fail alone (separate worlds): the supervisor watches each; the
        # engine is down only while every one is. 0 for one core, or cores that step together.
        self.num_cores: int = int(getattr(llm, "independent_cores", 0))
        self._cores_down: dict[int, str] = {}  # core -> why it is down (for the log)
        self._cores_given_up: set[int] = set()
        self.num_waiting = 0  # sequences of admitted requests that have not produced their first token
        self.inflight: set[asyncio.Task] = set()
        self.log_requests = log_requests
        self.request_timeout_s = request_timeout_s
        self._awaiting: dict[str, tuple[float, int]] = {}  # request id -> (arrival, prompt tokens)
        self._dead_errors, self._failed_errors = _engine_error_types()

    def describe(self) -> str:
        """One line on what this engine runs: limits, device, dtype."""
        info = self.info
        where = " ".join(str(v) for v in (getattr(info, "device", None), getattr(info, "dtype", None)) if v)
        return (f"max_model_len {self.max_model_len}, {getattr(info, 'num_device_pages', '?')} KV pages of "
                f"{self.page_size} tokens" + (f", {where}" if where else ""))

    def awaiting_first_token(self, now: float) -> list[tuple[str, float, int]]:
        """(request id, seconds waited, prompt tokens) of requests that have no output yet."""
        return [(rid, now - arrival, tokens) for rid, (arrival, tokens) in self._awaiting.items()]

    # -- liveness --------------------------------------------------------------------------
    @property
    def dead(self) -> bool:
        return self.dead_reason is not None

    def check_alive(self) -> bool:
        """Poll the engine; on the first failure remember why and fail every in-flight request."""
        if self.dead:
            return False
        reason = _engine_failure(self.llm)
        if reason is None:
            return True
        self.mark_dead(reason)
        return False

    @property
    def status(self) -> str:
        """What /health says: ok, restarting (503 until it is back) or dead (the supervisor gave up)."""
        if not self.dead:
            return "ok"
        return "dead" if self.given_up else "restarting"

    def mark_dead(self, reason: str) -> None:
        if self.dead:
            return
        self.dead_reason = reason
        log.error("engine core is down: %s", reason)
        for task in list(self.inflight):
            task.cancel(msg="engine dead")

    @property
    def can_restart(self) -> bool:
        return callable(getattr(self.llm, "restart_core" if self.num_cores else "restart", None))

    async def restart(self) -> None:
        """Start a fresh engine core (the old one is dead); raises if it cannot start."""
        await self.llm.restart()
        self.engine_pid = getattr(self.llm, "engine_pid", None)
        self.info = self.llm.engine_info
        self.dead_reason = None
        self.num_restarts += 1
        log.info("engine core is back (pid %s)", self.engine_pid)

    # -- data-parallel cores that fail alone -------------------------------------------------
    def check_core(self, core: int) -> bool:
        """Poll one independent core; on its first failure remember why (its own requests fail with
        CoreDead, the router skips it), and the whole engine is down once every core is."""
        if core in self._cores_down:
            return False
        if not self.llm.core_errored(core):
            return True
        pid = self.llm.cores[core].engine_pid
        self._cores_down[core] = reason = f"data-parallel engine core {core} (pid {pid}) is not running"
        log.error("%s; the other cores carry on", reason)
        self.check_alive()
        return False

    def core_statuses(self) -> list[str]:
        """Per independent core, what /health says of it: ok, restarting or dead ([] for one engine)."""
        return ["ok" if self.check_core(d) else "dead" if d in self._cores_given_up else "restarting"
                for d in range(self.num_cores)]

    async def restart_core(self, core: int) -> None:
        """Start one independent core again; raises if it cannot start."""
        await self.llm.restart_core(core)
        self._cores_down.pop(core, None)
        self.info, self.engine_pid = self.llm.engine_info, self.llm.engine_pid
        self.dead_reason = None  # a core serves again, whatever the others do
        self.num_restarts += 1
        log.info("data-parallel engine core %d is back (pid %s)", core, self.llm.cores[core].engine_pid)

    def give_up_core(self, core: int) -> None:
        self._cores_given_up.add(core)
        if len(self._cores_given_up) == self.num_cores:
            self.given_up = True

    def stats(self) -> dict[str, Any]:
        """The engine's latest stats snapshot (AsyncLLM.stats(): running, waiting, kv usage, ...) and the
        gateway's own load: requests in flight, sequences waiting, asyncio tasks, engine restarts."""
        stats = dict(self.llm.stats())
        stats.update(gateway_inflight_requests=len(self.inflight), gateway_waiting_sequences=self.num_waiting,
                     gateway_tasks=_num_tasks(), engine_restarts=self.num_restarts)
        return stats

    # -- requests --------------------------------------------------------------------------
    def make_sampling_params(self, **kwargs: Any) -> Any:
        """SamplingParams asking for delta outputs: each yield carries only the new text and tokens."""
        from lightspeed import RequestOutputKind, SamplingParams

        return SamplingParams(output_kind=RequestOutputKind.DELTA, **kwargs)

    async def generate(self, prompt_token_ids: list[int], params: Any, request_id: str,
                       timing: RequestTiming, priority: int = 0, session: str | None = None) -> AsyncIterator[Any]:
        """Delta RequestOutputs; aborts the request in the engine if the consumer stops early or its
        time runs out (RequestTimeout). `priority`: vLLM's meaning, lower is scheduled earlier;
        `session` names the conversation (a retention hint for its cached prefix)."""
        if self.dead:
            raise EngineDead(self.dead_reason)
        deadline = _Deadline(asyncio.current_task(), self.request_timeout_s - (time.monotonic() - timing.arrival))
        self.inflight.add(deadline.consumer)
        waiting = int(getattr(params, "n", 1) or 1)
        self.num_waiting += waiting
        self._awaiting[request_id] = (timing.arrival, len(prompt_token_ids))
        if self.log_requests:
            log.info("request %s: %d prompt tokens, max_tokens %s, temperature %s, priority %d", request_id,
                     len(prompt_token_ids), params.max_tokens, params.temperature, priority)
        started = finished = False
        generated, reasons = 0, []
        extra = {"priority": priority} if priority else {}
        try:
            async for out in self.llm.generate(prompt_token_ids, params, request_id=request_id, session_id=session,
                                               **extra):
                current = asyncio.current_task()
                if current is not deadline.consumer:  # consumed by another task now (a stream after its first token)
                    self.inflight.discard(deadline.consumer)
                    deadline.consumer = current
                    self.inflight.add(current)
                now = time.monotonic()
                if not started:
                    started, timing.first_token = True, now
                    self.num_waiting -= waiting
                    self._awaiting.pop(request_id, None)
                else:
                    timing.gaps.append(now - timing.last_token)
                timing.last_token = now
                finished = bool(out.finished)
                if self.log_requests:
                    generated += sum(len(c.token_ids) for c in out.outputs)
                    reasons += [c.finish_reason for c in out.outputs if c.finish_reason]
                yield out
            finished = True
        except CoreDead:  # one data-parallel core of several: only its requests fail
            raise
        except asyncio.CancelledError:
            if self.dead:
                raise EngineDead(self.dead_reason) from None
            if deadline.expired:
                _uncancel(deadline.consumer)
                raise RequestTimeout(f"the request took longer than {self.request_timeout_s:g} s") from None
            raise
        except self._dead_errors as e:
            self.mark_dead(str(e) or type(e).__name__)
            raise EngineDead(self.dead_reason) from None
        except self._failed_errors as e:
            raise RequestFailed(str(e)) from None
        except (ValueError, OverflowError) as e:
            raise RequestRejected(str(e)) from None
        finally:
            deadline.cancel()
            self.inflight.discard(deadline.consumer)
            self._awaiting.pop(request_id, None)
            if not started:
                self.num_waiting -= waiting
            if self.log_requests:
                _log_finished(request_id, timing, generated, reasons if finished else ["abort"])
            if not finished and not self.dead:
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            result = self.llm.abort(request_id)
            if inspect.isawaitable(result):
                await result

    def shutdown(self) -> None:
        self.llm.shutdown()


def _log_finished(request_id: str, timing: RequestTiming, generated: int, reasons: list[str]) -> None:
    end = timing.last_token or time.monotonic()
    ttft = f"{timing.first_token - timing.arrival:.3f} s" if timing.first_token is not None else "-"
    decode_s = end - timing.first_token if timing.first_token is not None else 0.0
    speed = f", {(generated - 1) / decode_s:.1f} tok/s after the first" if generated > 1 and decode_s > 0 else ""
    log.info("request %s finished (%s): %d tokens, first token after %s, %.3f s in all%s", request_id,
             ",".join(dict.fromkeys(reasons)) or "abort", generated, ttft, end - timing.arrival, speed)


def _engine_failure(llm: Any) -> str | None:
    """Why the engine is down, or None while it is healthy (`errored` checks the core process)."""
    if llm.errored:
        pid = getattr(llm, "engine_pid", "?")
        return f"engine core process (pid {pid}) is not running"
    return None


class _Deadline:
    """Cancels the task reading a request's stream when the request's time is up: one timer per
    request, nothing per token. `consumer` is updated when another task takes the stream over."""

    def __init__(self, consumer: asyncio.Task, seconds: float) -> None:
        self.consumer, self.expired = consumer, False
        self._timer = asyncio.get_running_loop().call_later(max(0.0, seconds), self._expire)

    def _expire(self) -> None:
        self.expired = True
        self.consumer.cancel(msg="request timeout")

    def cancel(self) -> None:
        self._timer.cancel()


def _uncancel(task: asyncio.Task) -> None:
    """Undo our own timeout's cancel() (Python >= 3.11 counts them), so the task may go on answering."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


def _num_tasks() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (a scrape from another thread)
        return 0
