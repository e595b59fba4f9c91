"""A small stand-in for `lightspeed.AsyncLLM` (tests only): same interface, scripted output.

Output script, read from the prompt text:
- `SAY:<text>` anywhere in the prompt: the reply is exactly <text> (tokenised), then EOS;
- `SPELL:<text>`: the reply is <text> one character per token (ids a fresh tokenisation of the
  text does not give back, as a real model's may not), then EOS;
- otherwise the reply repeats " lorem ipsum" until max_tokens (finish_reason "length").
- `DIE` in the prompt kills the fake core: in-flight and later requests fail with EngineDeadError.
Each token takes `token_delay_s`; pages are "held" while a request runs so stats show them return.
"""

from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from lightspeed import (
    CompletionOutput,
    EngineDeadError,
    Logprob,
    RequestOutput,
    RequestOutputKind,
    load_tokenizer,
)


@dataclass
class FakeInfo:
    max_model_len: int
    page_size: int
    vocab_size: int
    num_device_pages: int


class FakeAsyncLLM:
    def __init__(self, model: str, max_model_len: int = 2048, page_size: int = 16, token_delay_s: float = 0.002,
                 max_num_seqs: int = 256):
        self.tokenizer = load_tokenizer(model)
        self.model_name = model
        self.engine_info = FakeInfo(max_model_len, page_size, len(self.tokenizer), 4096)
        # A child process stands in for the engine core, so liveness and orphan checks are real.
        self._core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        self.engine_pid = self._core.pid
        self.token_delay_s = token_delay_s
        self._dead: EngineDeadError | None = None
        self._aborted: set[str] = set()
        self._running: dict[str, int] = {}  # request id -> pages held
        self._seen_prefixes: list[list[int]] = []
        self._waiting = 0
        self._slots = asyncio.Semaphore(max_num_seqs)  # like the scheduler's max_num_seqs

    @property
    def errored(self) -> bool:
        return self._dead is not None or self._core.poll() is not None

    def get_tokenizer(self):
        return self.tokenizer

    def stats(self) -> dict[str, Any]:
        used = sum(self._running.values())
        total = self.engine_info.num_device_pages
        return {"num_running": len(self._running), "num_waiting": self._waiting, "num_retracted": 0,
                "kv_usage": used / total, "num_device_pages": total, "free_device_pages": total - used,
                "prefix_hit_tokens": 0, "prefix_query_tokens": 0, "num_steps": 0}

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    def shutdown(self) -> None:
        self._dead = self._dead or EngineDeadError("the engine was shut down")
        self._core.kill()
        self._core.wait()

    def _cached(self, prompt: list[int]) -> int:
        best = 0
        for old in self._seen_prefixes:
            n = 0
            for a, b in zip(old, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._seen_prefixes.append(list(prompt))
        page = self.engine_info.page_size
        return min(best, len(prompt) - 1) // page * page

    def _script(self, prompt_text: str, max_tokens: int) -> tuple[list[int], str]:
        match = re.search(r"(SAY|SPELL):(.*?)(?:<\|im_end\|>|$)", prompt_text, re.S)
        if match:
            text = match.group(2)
            pieces = list(text) if match.group(1) == "SPELL" else [text]
            ids = [i for piece in pieces for i in self.tokenizer.encode(piece, add_special_tokens=False)]
            eos = self.tokenizer.eos_token_id
            return (ids + [eos])[:max_tokens], ("stop" if len(ids) < max_tokens else "length")
        filler = self.tokenizer.encode(" lorem ipsum" * (max_tokens // 2 + 1), add_special_tokens=False)
        return filler[:max_tokens], "length"

    async def generate(self, prompt, params, request_id, priority: int = 0, session_id=None):
        if self._dead is not None:
            raise self._dead
        prompt_ids = list(prompt)
        prompt_text = self.tokenizer.decode(prompt_ids)
        if "DIE" in prompt_text:
            self._dead = EngineDeadError("fake core killed by the test")
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            async for out in self._run(prompt_ids, prompt_text, params, request_id):
                yield out
        finally:
            self._slots.release()

    async def _run(self, prompt_ids, prompt_text, params, request_id):
        cached = self._cached(prompt_ids)
        pages = math.ceil(len(prompt_ids) / self.engine_info.page_size)
        self._running[request_id] = pages
        states = []
        for _ in range(params.n):
            ids, reason = self._script(prompt_text, params.max_tokens)
            cut = next((k for k, t in enumerate(ids) if t in params.stop_token_ids), None)
            if cut is not None:
                ids, reason = ids[: cut + 1], "stop"
            states.append({"ids": ids, "reason": reason, "pos": 0, "text": ""})
        try:
            while True:
                await asyncio.sleep(self.token_delay_s)
                if self._core.poll() is not None:
                    self._dead = EngineDeadError(f"fake core died with code {self._core.returncode}")
                if self._dead is not None:
                    raise self._dead
                if request_id in self._aborted:
                    return
                outputs, finished = [], True
                for i, st in enumerate(states):
                    if st["pos"] >= len(st["ids"]):
                        continue
                    token = st["ids"][st["pos"]]
                    st["pos"] += 1
                    done = st["pos"] >= len(st["ids"])
                    piece = "" if token == self.tokenizer.eos_token_id else self.tokenizer.decode([token])
                    stop_hit = next((s for s in params.stop if s in st["text"] + piece), None)
                    if stop_hit:
                        full = st["text"] + piece
                        piece = full[: full.index(stop_hit)][len(st["text"]):]
                        done, st["reason"] = True, "stop"
                        st["pos"] = len(st["ids"])
                    st["text"] += piece
                    logprobs = None
                    if params.logprobs is not None:
                        entry = {token: Logprob(-0.5, 1, piece)}
                        for r in range(params.logprobs):
                            entry.setdefault(100 + r, Logprob(-1.0 - r, r + 1, None))
                        logprobs = [entry]
                    outputs.append(CompletionOutput(i, piece, [token], st["reason"] if done else None, logprobs))
                    finished = finished and done
                finished = all(st["pos"] >= len(st["ids"]) for st in states)
                assert params.output_kind == RequestOutputKind.DELTA
                yield RequestOutput(request_id, None, prompt_ids, outputs, finished, cached)
                if finished:
                    return
        finally:
            self._running.pop(request_id, None)
            self._aborted.discard(request_id)
