"""EngineClient: the gateway's one view of `lightspeed.AsyncLLM`.

It asks for delta outputs (only new text, tokens and logprobs per CompletionOutput), tracks in-flight
requests for admission control and engine-death handling, aborts requests whose consumer left, and
reads liveness and the stats snapshot the metrics need.
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


class RequestRejected(Exception):
    """The engine refused this request (e.g. a grammar it cannot compile); others carry on."""


@dataclass
class RequestTiming:
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between consecutive outputs


def _engine_dead_types() -> tuple[type[BaseException], ...]:
    try:
        from lightspeed import EngineDeadError
    except ImportError:
        return (EngineDead,)
    return (EngineDead, EngineDeadError)


class EngineClient:
    """Wraps an AsyncLLM-like object (`generate`, `abort`, `shutdown`, `get_tokenizer`)."""

    def __init__(self, llm: Any, tokenizer: Any | None = None, log_requests: bool = False) -> None:
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
        self.engine_pid: int | None = getattr(llm, "engine_pid", None)
        self.dead_reason: str | None = None
        self.num_waiting = 0  # admitted requests that have not produced their first token
        self.inflight: set[asyncio.Task] = set()
        self.log_requests = log_requests
        self._awaiting: dict[str, tuple[float, int]] = {}  # request id -> (arrival, prompt tokens)
        self._dead_errors = _engine_dead_types()

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

    def mark_dead(self, reason: str) -> None:
        if self.dead:
            return
        self.dead_reason = reason
        log.error("engine core is down: %s", reason)
        for task in list(self.inflight):
            task.cancel(msg="engine dead")

    def stats(self) -> dict[str, Any]:
        """The engine's latest stats snapshot (AsyncLLM.stats(): running, waiting, kv usage, ...)."""
        return self.llm.stats()

    # -- requests --------------------------------------------------------------------------
    def make_sampling_params(self, **kwargs: Any) -> Any:
        """SamplingParams asking for delta outputs: each yield carries only the new text and tokens."""
        from lightspeed import RequestOutputKind, SamplingParams

        return SamplingParams(output_kind=RequestOutputKind.DELTA, **kwargs)

    async def generate(self, prompt_token_ids: list[int], params: Any, request_id: str,
                       timing: RequestTiming, priority: int = 0, session: str | None = None) -> AsyncIterator[Any]:
        """Delta RequestOutputs; aborts the request in the engine if the consumer stops early.
        `priority`: vLLM's meaning, lower is scheduled earlier; `session` names the conversation (a
        retention hint for its cached prefix)."""
        if self.dead:
            raise EngineDead(self.dead_reason)
        task = asyncio.current_task()
        self.inflight.add(task)
        self.num_waiting += 1
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
                if current is not task:  # consumed by another task now (a stream after its first token)
                    self.inflight.discard(task)
                    task = current
                    self.inflight.add(task)
                now = time.monotonic()
                if not started:
                    started, timing.first_token = True, now
                    self.num_waiting -= 1
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
        except asyncio.CancelledError:
            if self.dead:
                raise EngineDead(self.dead_reason) from None
            raise
        except self._dead_errors as e:
            self.mark_dead(str(e) or type(e).__name__)
            raise EngineDead(self.dead_reason) from None
        except (ValueError, OverflowError) as e:
            raise RequestRejected(str(e)) from None
        finally:
            self.inflight.discard(task)
            self._awaiting.pop(request_id, None)
            if not started:
                self.num_waiting -= 1
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
