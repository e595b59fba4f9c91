"""Structured outputs (JSON schema, JSON object, regex, EBNF) through xgrammar token bitmasks.

One GrammarMatcher per constrained request, keyed by the scheduler's request id. Each step the
constrained rows' allowed-token bitmasks are filled on the host and applied to the logits before
sampling; after sampling each matcher accepts its token. Unconstrained batches never reach here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

# xgrammar's messages start with its C++ log prefix: "[12:00:00] /path/to/file.cc:123: ".
_XGRAMMAR_LOG_PREFIX = re.compile(r"^\s*(\[[0-9:.]+\]\s*)?\S+\.(cc|cpp|h):\d+:\s*")


def _reason(error: Exception) -> str:
    """The error's own text, without the source location of the library that raised it."""
    lines = [_XGRAMMAR_LOG_PREFIX.sub("", line) for line in str(error).strip().splitlines()]
    return " ".join(line.strip() for line in lines if line.strip()) or type(error).__name__


class StructuredOutputs:
    def __init__(self, load_tokenizer: Callable[[], Any], vocab_size: int):
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self._compiler = None
        self._compiled: dict[tuple[str, str], Any] = {}
        self.matchers: dict[int, Any] = {}

    def _compile(self, kind: str, spec: str) -> Any:
        import xgrammar as xgr

        if self._compiler is None:
            info = xgr.TokenizerInfo.from_huggingface(self._load_tokenizer(), vocab_size=self.vocab_size)
            self._compiler = xgr.GrammarCompiler(info)
        key = (kind, spec)
        if key not in self._compiled:
            try:
                if kind == "json_schema":
                    grammar = self._compiler.compile_json_schema(spec)
                elif kind == "json_object":  # any JSON object (as OpenAI's json_object mode)
                    grammar = self._compiler.compile_json_schema('{"type": "object"}')
                elif kind == "regex":
                    grammar = self._compiler.compile_regex(spec)
                elif kind == "grammar":
                    grammar = self._compiler.compile_grammar(spec)
                else:
                    raise ValueError(f"unknown structured output kind {kind!r}")
            except ValueError:
                raise
            except Exception as e:  # xgrammar raises its own error types for bad schemas/regexes
                raise ValueError(f"invalid {kind} for structured output: {_reason(e)}") from None
            self._compiled[key] = grammar
        return self._compiled[key]

    def add(self, req_id: int, kind: str, spec: str) -> None:
        """Compile (cached) and start a matcher; ValueError for a bad schema / regex / grammar."""
        import xgrammar as xgr

        self.matchers[req_id] = xgr.GrammarMatcher(self._compile(kind, spec))

    def remove(self, req_id: int) -> None:
        self.matchers.pop(req_id, None)

    def apply(self, logits: torch.Tensor, row_req_ids: np.ndarray, rows: np.ndarray) -> None:
        """Mask logits [S, V] in place for the constrained `rows` (whose request ids are row_req_ids[rows])."""
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(logits.shape[0], self.vocab_size)
        for row in rows.tolist():
            self.matchers[int(row_req_ids[row])].fill_next_token_bitmask(bitmask, row)
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=rows.tolist())

    def accept(self, row_req_ids: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
        for row in rows.tolist():
            matcher = self.matchers.get(int(row_req_ids[row]))
            if matcher is not None and not matcher.is_terminated():
                matcher.accept_token(int(tokens[row]))
