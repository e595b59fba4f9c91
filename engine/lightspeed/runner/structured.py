"""Structured outputs (JSON schema, JSON object, regex, EBNF) through xgrammar token bitmasks.

Compilation is off the step loop: `GrammarCompiler` compiles on one worker thread (xgrammar releases
the GIL while it works; the tokenizer is loaded there too, at start-up on a GPU engine through
`warm`, else by the first constrained request) and keeps the compiled
grammars in a bounded LRU, so a repeated schema costs nothing and a stream of distinct ones cannot
grow memory. The engine parks a constrained request until its future is done, then starts its
matcher (`StructuredOutputs.start`, cheap).

One GrammarMatcher per running constrained request, keyed by the scheduler's request id. Each step
the constrained rows' allowed-token bitmasks are filled on the host and applied to the logits
before sampling; after sampling each matcher accepts its token. A matcher that raises fails its
own request only (`take_failures`); its row is left unmasked for that step. Unconstrained batches
never reach here.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

# xgrammar's messages start with its C++ log prefix: "[12:00:00] /path/to/file.cc:123: ".
_XGRAMMAR_LOG_PREFIX = re.compile(r"^\s*(\[[0-9:.]+\]\s*)?\S+\.(cc|cpp|h):\d+:\s*")


def _reason(error: Exception) -> str:
    """The error's own text, without the source location of the library that raised it."""
    lines = [_XGRAMMAR_LOG_PREFIX.sub("", line) for line in str(error).strip().splitlines()]
    return " ".join(line.strip() for line in lines if line.strip()) or type(error).__name__


log = logging.getLogger("lightspeed.runner")
# Most whitespace characters JSON output may put between two elements. Unbounded (xgrammar's default),
# a weak or random-weight model spends its whole budget on whitespace inside a constrained object and
# never closes it (seen with dummy weights: a tool call's arguments cut off at max_tokens); 16 still
# allows pretty-printing (a newline and 12 spaces at depth 3 with indent 4).
JSON_MAX_WHITESPACE = 16

KINDS = ("json_schema", "json_object", "regex", "grammar")
# Distinct grammars waiting for the worker at once: a large schema can take seconds to compile, so
# past this many a new one is refused rather than queued behind them without bound.
MAX_PENDING_COMPILES = 64


class GrammarCompiler:
    """Compiles grammars on a worker thread; `submit` returns a future of the compiled grammar."""

    def __init__(self, load_tokenizer: Callable[[], Any], vocab_size: int, cache_size: int):
        self._load_tokenizer, self.vocab_size, self.cache_size = load_tokenizer, vocab_size, cache_size
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compiler")
        self._compiler = None                                   # built on the worker, at first use
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()  # LRU of done or running compiles
        self._lock = threading.Lock()
        self._pending = 0  # submitted, not yet compiled

    def submit(self, kind: str, spec: str) -> Future:
        """A future of the compiled grammar; its exception is a ValueError naming what is wrong."""
        key = (kind, spec)
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                return future
            if self._pending >= MAX_PENDING_COMPILES:
                raise ValueError(f"{MAX_PENDING_COMPILES} grammars are compiling already; retry later")
            self._pending += 1
            future = self._worker.submit(self._compile, kind, spec)
            self._cache[key] = future
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)  # a running compile stays referenced by its requests
        future.add_done_callback(lambda f: self._forget_failure(key, f))
        return future

    def warm(self) -> Future:
        """Load the tokenizer and build xgrammar's compiler on the worker now, so the first
        constrained request does not wait for them (on the H200 the first tool call of a fresh server
        took 13.3 s, the next 0.3 s: bench/results/deepseek_serve_2026-12-02_0431_h200/). A failure is
        left for that request to report (the same error, raised again by `_compile`)."""
        def build():
            try:
                self._ensure_compiler(quiet=True)
            except Exception:  # noqa: BLE001 - e.g. no tokenizer: the first constrained request says so
                pass

        return self._worker.submit(build)

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    def _forget_failure(self, key: tuple[str, str], future: Future) -> None:
        with self._lock:
            self._pending -= 1
            # A bad grammar is not worth a cache slot.
            if (future.cancelled() or future.exception() is not None) and self._cache.get(key) is future:
                del self._cache[key]

    def _ensure_compiler(self, quiet: bool = False) -> None:
        """Build the compiler once (worker thread only); `quiet`: a tokenizer that fails to load is
        not logged (the warm-up's; the request that needs it logs and reports it)."""
        import xgrammar as xgr

        if self._compiler is None:
            try:
                info = xgr.TokenizerInfo.from_huggingface(self._load_tokenizer(), vocab_size=self.vocab_size)
            except ValueError:
                raise
            except Exception as e:
                if not quiet:
                    log.error("structured output: cannot load the tokenizer", exc_info=e)
                raise ValueError(f"structured output is unavailable: the tokenizer did not load "
                                 f"({type(e).__name__})") from None
            # xgrammar's own cache is unbounded: ours (above) is the one that holds grammars.
            self._compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    def _compile(self, kind: str, spec: str) -> Any:
        self._ensure_compiler()
        try:
            if kind == "json_schema":
                return self._compiler.compile_json_schema(spec, max_whitespace_cnt=JSON_MAX_WHITESPACE)
            if kind == "json_object":  # any JSON object (as OpenAI's json_object mode)
                return self._compiler.compile_json_schema('{"type": "object"}', max_whitespace_cnt=JSON_MAX_WHITESPACE)
            if kind == "regex":
                return self._compiler.compile_regex(spec)
            if kind == "grammar":
                return self._compiler.compile_grammar(spec)
        except Exception as e:  # xgrammar raises its own error types for bad schemas/regexes
            raise ValueError(f"invalid {kind} for structured output: {_reason(e)}") from None
        raise ValueError(f"unknown structured output kind {kind!r}; expected one of {', '.join(KINDS)}")

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


class StructuredOutputs:
    def __init__(self, load_tokenizer: Callable[[], Any], vocab_size: int, cache_size: int = 256):
        self.vocab_size = vocab_size
        self.compiler = GrammarCompiler(load_tokenizer, vocab_size, cache_size)
        self.matchers: dict[int, Any] = {}
        self._failures: list[tuple[int, BaseException]] = []

    def warm(self) -> Future:
        """See GrammarCompiler.warm."""
        return self.compiler.warm()

    def compile(self, kind: str, spec: str) -> Future:
        """Start (or reuse) the compilation of a grammar; see GrammarCompiler.submit."""
        return self.compiler.submit(kind, spec)

    def start(self, req_id: int, compiled: Any) -> None:
        """Begin matching a request's output against its compiled grammar."""
        import xgrammar as xgr

        self.matchers[req_id] = xgr.GrammarMatcher(compiled)

    def remove(self, req_id: int) -> None:
        self.matchers.pop(req_id, None)

    def take_failures(self) -> list[tuple[int, BaseException]]:
        failures, self._failures = self._failures, []
        return failures

    def apply(self, logits: torch.Tensor, row_req_ids: np.ndarray, rows: np.ndarray) -> None:
        """Mask logits [S, V] in place for the constrained `rows` (whose request ids are row_req_ids[rows])."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        masked = []
        for row in rows.tolist():
            req_id = int(row_req_ids[row])
            try:
                self.matchers[req_id].fill_next_token_bitmask(bitmask, row)
            except Exception as e:
                self._failures.append((req_id, e))
                continue
            masked.append(row)
        if masked:
            xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=masked)

    def accept(self, row_req_ids: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
        for row in rows.tolist():
            req_id = int(row_req_ids[row])
            matcher = self.matchers.get(req_id)
            if matcher is None or matcher.is_terminated():
                continue
            try:
                matcher.accept_token(int(tokens[row]))
            except Exception as e:
                self._failures.append((req_id, e))
