"""Incremental detokenisation and stop strings, per request, in the client process."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Turns a stream of token ids into text without re-decoding everything each step.

    Uses the `tokenizers` DecodeStream (handles multi-byte characters split across tokens and
    byte-fallback tokens); a slow tokenizer falls back to decoding a short window of recent ids.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._backend = getattr(tokenizer, "_tokenizer", None)
        self._stream = None
        if self._backend is not None:
            from tokenizers.decoders import DecodeStream

            # Seed the stream with the prompt's tail so the first output token decodes in context
            # (leading-space rules of SentencePiece-style decoders).
            tail = list(prompt_token_ids[-4:])
            try:
                self._stream = DecodeStream(ids=tail, skip_special_tokens=skip_special_tokens)
            except TypeError:
                self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def step(self, token_ids: list[int]) -> str:
        """Feed new token ids; returns the newly decodable text (may be empty)."""
        if self._stream is not None:
            pieces = [self._stream.step(self._backend, t) for t in token_ids]
            return "".join(p for p in pieces if p)
        return self._window_step(token_ids)

    def _window_step(self, token_ids: list[int]) -> str:
        self._ids.extend(token_ids)
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=self._skip)
        full = decode(self._ids[self._prefix_offset:], skip_special_tokens=self._skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return full[len(prefix):]
        return ""


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
