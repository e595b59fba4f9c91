"""An in-process fake OpenAI-compatible server with scripted timings, for testing the benchmark.

Raw asyncio HTTP/1.1 on 127.0.0.1 (random free port) in a background thread: full control over
when each SSE chunk leaves and how a stream breaks, and no dependency beyond the standard
library. One "token" is one whitespace-separated word, in prompts and in /tokenize alike.
Tokens are sent on an absolute schedule (first at TTFT, then one every TPOT) so client-side
means are exact up to scheduling noise at the two ends.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def count_words(text: str) -> int:
    return len(text.split())


def render_chat(messages: list[dict[str, str]]) -> list[str]:
    """The fake chat template: a role marker word, then the content's words, per message."""
    words: list[str] = []
    for msg in messages:
        words.append(f"<{msg['role']}>")
        words.extend(msg["content"].split())
    return words


@dataclass
class Script:
    """How the fake server behaves; request indices count completion requests from 0."""

    ttft_s: float = 0.05
    tpot_s: float = 0.01
    # cached tokens to report: None -> a perfect word-level prefix cache; else f(index, prompt_tokens)
    cached: Callable[[int, int], int] | None = None
    fail: set[int] = field(default_factory=set)  # answer HTTP 500 to these requests
    drop: dict[int, int] = field(default_factory=dict)  # request -> tokens sent before the connection drops
    report_cached: bool = True  # include usage.prompt_tokens_details
    metrics: bool = True  # serve /metrics
    tokenize: bool = True  # serve /tokenize
    reject_fields: set[str] = field(default_factory=set)  # body fields answered with HTTP 400
    max_model_len: int | None = None  # reported by /v1/models; longer requests get HTTP 400
    device: str | None = None  # reported by /version (as Lightspeed does)


class FakeOpenAI:
    """Start with `with FakeOpenAI(Script(...)) as srv:`; `srv.base_url`, `srv.requests` (bodies seen)."""

    def __init__(self, script: Script | None = None):
        self.script = script or Script()
        self.requests: list[dict[str, Any]] = []  # completion requests, in arrival order
        self.probes: list[dict[str, Any]] = []  # max_tokens == 1 requests (the tool's probe)
        self.tokenize_calls = 0
        self.hit_tokens = 0
        self.prompt_tokens = 0
        self._seen: list[list[str]] = []  # prompts + answers, for the perfect cache
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        fut = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, sock=sock), self._loop)
        self._server = fut.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            for task in self._handlers:  # idle keep-alive connections
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # --- HTTP plumbing -------------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    key, value = h.decode().split(":", 1)
                    headers[key.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                if not await self._route(method, path, body, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            return
        finally:
            self._handlers.discard(task)
            writer.close()

    @staticmethod
    def _json(writer: asyncio.StreamWriter, status: int, obj: Any, ctype: str = "application/json") -> None:
        payload = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection must close."""
        if path == "/v1/models":
            card = {"id": "fake-model", "object": "model"}
            if self.script.max_model_len is not None:
                card["max_model_len"] = self.script.max_model_len
            self._json(writer, 200, {"object": "list", "data": [card]})
        elif path == "/version":
            self._json(writer, 200, {"version": "fake-0.1", **({"device": self.script.device}
                                                              if self.script.device else {})})
        elif path == "/tokenize" and self.script.tokenize:
            self.tokenize_calls += 1
            words = json.loads(body)["prompt"].split()
            self._json(writer, 200, {"tokens": list(range(len(words))), "count": len(words)})
        elif path == "/metrics" and self.script.metrics:
            self._json(writer, 200, self._metrics_text(), "text/plain; version=0.0.4")
        elif path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            return await self._complete(json.loads(body), path.endswith("chat/completions"), writer)
        else:
            self._json(writer, 404, {"error": {"message": f"no route {path}"}})
        await writer.drain()
        return True

    def _metrics_text(self) -> str:
        return ("# HELP lightspeed:prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache.\n"
                "# TYPE lightspeed:prefix_cache_hit_tokens_total counter\n"
                f"lightspeed:prefix_cache_hit_tokens_total{{model_name=\"fake-model\"}} {self.hit_tokens}.0\n"
                "# TYPE lightspeed:prompt_tokens_total counter\n"
                f"lightspeed:prompt_tokens_total{{model_name=\"fake-model\"}} {self.prompt_tokens}.0\n"
                "# TYPE lightspeed:time_to_first_token_seconds histogram\n"
                "lightspeed:time_to_first_token_seconds_count 3.0\n")

    # --- completions ---------------------------------------------------------------------
    def _perfect_cached(self, words: list[str]) -> int:
        best = 0
        for seen in self._seen:
            n = 0
            for a, b in zip(words, seen, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best

    async def _complete(self, req: dict[str, Any], chat: bool, writer: asyncio.StreamWriter) -> bool:
        rejected = sorted(self.script.reject_fields & set(req))
        if rejected:
            self._json(writer, 400, {"error": {"message": f"unknown field: {rejected[0]}", "type": "invalid_request"}})
            await writer.drain()
            return True
        if req.get("max_tokens") == 1:
            self.probes.append(req)
            choice = {"index": 0, "delta": {"content": "ok"}} if chat else {"index": 0, "text": "ok"}
            self._json(writer, 200, f"data: {json.dumps({'choices': [choice]})}\n\ndata: [DONE]\n\n",
                       "text/event-stream")
            await writer.drain()
            return True
        index = len(self.requests)
        self.requests.append(req)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if index in self.script.fail:
            self._json(writer, 500, {"error": {"message": "scripted failure", "type": "server_error"}})
            await writer.drain()
            return True
        words = render_chat(req["messages"]) if chat else req["prompt"].split()
        n_prompt = len(words)
        limit = self.script.max_model_len
        if limit is not None and n_prompt + req["max_tokens"] > limit:
            self._json(writer, 400, {"error": {"message": f"This model's maximum context length is {limit} tokens.",
                                               "type": "invalid_request_error"}})
            await writer.drain()
            return True
        cached = (self._perfect_cached(words) if self.script.cached is None
                  else self.script.cached(index, n_prompt))
        self.hit_tokens += cached
        self.prompt_tokens += n_prompt
        n_out = req["max_tokens"]
        answer = [f"w{index}_{i}" for i in range(n_out)]
        self._seen.append(words + (["<assistant>"] if chat else []) + answer)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")

        def event(obj: Any) -> bytes:
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        for i, word in enumerate(answer):
            if self.script.drop.get(index) == i:
                await writer.drain()
                writer.transport.abort()  # mid-stream: no terminating chunk, no [DONE]
                return False
            delay = start + self.script.ttft_s + i * self.script.tpot_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            text = word if i == 0 else " " + word
            choice = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if chat
                      else {"index": 0, "text": text, "finish_reason": None})
            if i == n_out - 1:
                choice["finish_reason"] = "length"
            writer.write(event({"id": f"r{index}", "choices": [choice]}))
            await writer.drain()
        usage: dict[str, Any] = {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                 "total_tokens": n_prompt + n_out}
        if self.script.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        writer.write(event({"id": f"r{index}", "choices": [], "usage": usage}))
        writer.write(event(b"[DONE]") + b"0\r\n\r\n")
        await writer.drain()
        return True
