"""Incremental detokenisation and stop strings, per request, in the client process.

Design note: every engine step brings one token for each running request. Decoding them one call
per token would hold the GIL in the Rust tokenizer for each, on the event loop that also serves
every stream. Instead each sequence turns its new token into two id windows (see
`IncrementalDetokenizer`), and `StepDetokenizer` decodes all windows of a big step in one
`decode_batch` call, which releases the GIL, in a worker thread, so the event loop keeps streaming
while the tokenizer works; a small step decodes inline, window by window (cheaper than both the
thread handoff and the batch call's thread pool at that size).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Any

# Below this many tokens in a step, handing the decode to the worker thread costs more than the
# decode itself (a thread handoff is tens of microseconds, a token's windows a few).
OFFLOAD_MIN_TOKENS = 16


class IncrementalDetokenizer:
    """Turns a stream of token ids into text without re-decoding everything each step.

    Window algorithm (as the `tokenizers` DecodeStream): the text of the ids after `read` is
    decode(ids[prefix:]) minus decode(ids[prefix:read]); it is emitted once it does not end in a
    partial character (U+FFFD: a multi-byte character split across tokens, byte-fallback tokens),
    and then the window moves on. The prompt's last ids seed the window so the first output token
    decodes in context (leading-space rules of SentencePiece-style decoders).
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-4:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """Add new ids; the two windows to decode: (the context before them, context plus them)."""
        self._ids.extend(token_ids)
        return self._ids[self._prefix:self._read], self._ids[self._prefix:]

    def accept(self, prefix_text: str, full_text: str) -> str:
        """The newly decodable text, given the decoded windows of the last push (may be empty)."""
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            del self._ids[: self._read]  # never decoded again: the next window starts at `read`
            self._prefix, self._read = 0, len(self._ids)
            return full_text[len(prefix_text):]
        return ""

    def step(self, token_ids: list[int]) -> str:
        """Feed new token ids and decode them now; returns the newly decodable text."""
        return self.accept(*decode_windows(self._tokenizer, list(self.push(token_ids)), self.skip_special_tokens))


def decode_windows(tokenizer: Any, windows: list[list[int]], skip_special_tokens: bool,
                   batch: bool = False) -> list[str]:
    """Texts of id windows. `batch`: one Rust `decode_batch` call, which releases the GIL but hands
    the work to the tokenizer's thread pool: measured 14 µs of CPU per window for a 2-window call
    against 2 µs decoding one by one, about even from a few dozen windows on."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return [tokenizer.decode(w, skip_special_tokens=skip_special_tokens) for w in windows]
    if batch:
        return backend.decode_batch(windows, skip_special_tokens=skip_special_tokens)
    return [backend.decode(w, skip_special_tokens=skip_special_tokens) for w in windows]


class StepDetokenizer:
    """Decodes one engine step's new tokens for all its sequences together."""

    def __init__(self, tokenizer: Any, executor: Executor) -> None:
        self._tokenizer = tokenizer
        self._executor = executor

    async def decode(self, detoks: list[IncrementalDetokenizer], tokens: list[int] | list[list[int]]) -> list[str]:
        """New text per sequence (`detoks[i]` gets `tokens[i]`: one id, or a list of them), in order."""
        groups: dict[bool, list[int]] = {}
        windows: dict[bool, list[list[int]]] = {}
        for i, (detok, token) in enumerate(zip(detoks, tokens, strict=True)):
            flag = detok.skip_special_tokens
            groups.setdefault(flag, []).append(i)
            windows.setdefault(flag, []).extend(detok.push(token if isinstance(token, list) else [token]))

        def run(batch: bool) -> dict[bool, list[str]]:
            return {flag: decode_windows(self._tokenizer, w, flag, batch) for flag, w in windows.items()}

        if len(tokens) >= OFFLOAD_MIN_TOKENS:
            texts = await asyncio.get_running_loop().run_in_executor(self._executor, run, True)
        else:
            texts = run(False)
        out = [""] * len(tokens)
        for flag, members in groups.items():
            decoded = texts[flag]
            for k, i in enumerate(members):
                out[i] = detoks[i].accept(decoded[2 * k], decoded[2 * k + 1])
        return out


class StopStringChecker:
    """Finds the first stop string in the growing text.

    Only the tail that can contain a new match is searched. For streaming, `safe_len` tells how
    much text can be shown without risking that a later token completes a stop string.
    """

    def __init__(self, stop: list[str], include_stop_str_in_output: bool) -> None:
        self.stop = stop
        self.include = include_stop_str_in_output
        self.max_len = max((len(s) for s in stop), default=0)

    def check(self, text: str, new_chars: int) -> tuple[str, str] | None:
        """-> (truncated text, the stop string) when `text`'s last `new_chars` chars complete one."""
        if not self.stop or new_chars <= 0:
            return None
        start = max(0, len(text) - new_chars - self.max_len + 1)
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        i, s = best
        return (text[: i + len(s)] if self.include else text[:i]), s

    def safe_len(self, text: str, finished: bool) -> int:
        """How many leading chars of `text` can be shown now."""
        if finished or not self.stop:
            return len(text)
        return max(0, len(text) - self.max_len + 1)
