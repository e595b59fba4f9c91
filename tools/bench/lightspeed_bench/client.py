"""One streamed request, timed on the client: every figure this tool reports starts here."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class RequestRecord:
    """What one request did, with times in seconds from the run's clock (time.perf_counter)."""

    conv_id: str
    turn: int
    level: int  # concurrency level it ran under
    warmup: bool  # excluded from the level's metrics
    start: float = 0.0  # request sent
    first_token: float | None = None  # first chunk carrying text
    end: float | None = None  # stream finished ([DONE] or usage), or the failure time
    chunk_times: list[float] = field(default_factory=list)  # arrival of each text-bearing chunk
    prompt_tokens: int | None = None  # usage.prompt_tokens
    completion_tokens: int | None = None  # usage.completion_tokens, else the text-chunk count
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (None: not reported)
    ideal_cached_tokens: int | None = None  # what a perfect prefix cache could serve (estimate)
    error: str | None = None  # None, "http_<status>", "dropped_stream", "timeout", "connect", ...
    error_detail: str = ""
    answer: str = ""  # generated text, appended to the conversation for the next turn
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first: (end of decode - first token) / (n - 1)."""
        if self.first_token is None or not self.chunk_times or (self.completion_tokens or 0) < 2:
            return None
        return (self.chunk_times[-1] - self.first_token) / (self.completion_tokens - 1)

    @property
    def itls(self) -> list[float]:
        """Gaps between consecutive text chunks (one token each on servers that stream per token)."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    def to_json(self) -> dict[str, Any]:
        return {
            "conv_id": self.conv_id, "turn": self.turn, "level": self.level, "warmup": self.warmup,
            "start": self.start, "ttft": self.ttft, "tpot": self.tpot,
            "latency": None if self.end is None else self.end - self.start,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens, "ideal_cached_tokens": self.ideal_cached_tokens,
            "chunks": len(self.chunk_times), "error": self.error, "error_detail": self.error_detail[:300],
            "finish_reason": self.finish_reason,
        }


@dataclass(frozen=True)
class RequestOptions:
    """Body fields common to every request of a run."""

    model: str
    endpoint: str = "chat"  # "chat": /v1/chat/completions, "completions": /v1/completions
    ignore_eos: bool = True  # vLLM/SGLang/Lightspeed extension: decode exactly max_tokens
    min_tokens: bool = True  # also send min_tokens = max_tokens, for servers without ignore_eos
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def body(self, prompt: list[dict[str, str]] | str, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": max_tokens, "temperature": self.temperature,
            "stream": True, "stream_options": {"include_usage": True},
        }
        body["messages" if self.endpoint == "chat" else "prompt"] = prompt
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.min_tokens:
            body["min_tokens"] = max_tokens
        body.update(self.extra_body)
        return body


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        delta = choice["delta"] or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


def _apply_usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
    rec.completion_tokens = usage.get("completion_tokens", rec.completion_tokens)
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        rec.cached_tokens = int(details["cached_tokens"])


async def stream_request(
    client: httpx.AsyncClient, options: RequestOptions, prompt: list[dict[str, str]] | str,
    max_tokens: int, rec: RequestRecord,
) -> RequestRecord:
    """Send one streaming request and fill `rec`; failures are recorded, never raised."""
    pieces: list[str] = []
    done = False
    rec.start = time.perf_counter()
    try:
        async with client.stream("POST", options.path, json=options.body(prompt, max_tokens)) as resp:
            if resp.status_code != 200:
                rec.error = f"http_{resp.status_code}"
                rec.error_detail = (await resp.aread()).decode(errors="replace")
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                chunk = json.loads(payload)
                if "error" in chunk:
                    rec.error, rec.error_detail = "stream_error", json.dumps(chunk["error"])
                    return rec
                text = _chunk_text(chunk)
                if text:
                    if rec.first_token is None:
                        rec.first_token = now
                    rec.chunk_times.append(now)
                    pieces.append(text)
                choices = chunk.get("choices") or []
                if choices and choices[0].get("finish_reason"):
                    rec.finish_reason = choices[0]["finish_reason"]
                if chunk.get("usage"):
                    _apply_usage(rec, chunk["usage"])
        if not done:
            rec.error, rec.error_detail = "dropped_stream", "stream ended without [DONE]"
    except httpx.TimeoutException as exc:
        rec.error, rec.error_detail = "timeout", repr(exc)
    except httpx.ConnectError as exc:
        rec.error, rec.error_detail = "connect", repr(exc)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
        rec.error, rec.error_detail = "dropped_stream", repr(exc)
    except (json.JSONDecodeError, httpx.HTTPError) as exc:
        rec.error, rec.error_detail = "protocol", repr(exc)
    finally:
        rec.end = time.perf_counter()
        rec.answer = "".join(pieces)
        if rec.completion_tokens is None and rec.chunk_times:
            rec.completion_tokens = len(rec.chunk_times)
    return rec
