"""`<think>…</think>` reasoning parser: reasoning goes to `reasoning_content`, the rest to content."""

from __future__ import annotations

from lightspeed_gateway.parsers.base import ParsedDelta, split_partial_tag


class ThinkReasoningParser:
    """States: start (is there a `<think>`?), reasoning, after (drop whitespace right after
    `</think>`), content. `start_in_reasoning` is for templates whose prompt already opens `<think>`.
    """

    OPEN, CLOSE = "<think>", "</think>"

    def __init__(self, start_in_reasoning: bool = False) -> None:
        self._state = "reasoning" if start_in_reasoning else "start"
        self._buffer = ""

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        self._buffer += text
        while self._buffer:
            if self._state == "content":
                out.content += self._buffer
                self._buffer = ""
            elif self._state == "start":
                head = self._buffer.lstrip()
                if head.startswith(self.OPEN):
                    self._state, self._buffer = "reasoning", head[len(self.OPEN) :]
                elif self.OPEN.startswith(head):
                    break  # still undecided: empty or a prefix of <think>
                else:
                    self._state = "content"
            elif self._state == "reasoning":
                end = self._buffer.find(self.CLOSE)
                if end < 0:
                    safe, self._buffer = split_partial_tag(self._buffer, self.CLOSE)
                    out.reasoning += safe
                    break
                out.reasoning += self._buffer[:end]
                self._state, self._buffer = "after", self._buffer[end + len(self.CLOSE) :]
            else:  # after
                stripped = self._buffer.lstrip()
                if not stripped:
                    self._buffer = ""
                    break
                self._state, self._buffer = "content", stripped
        return out

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if self._state == "start":
            out.content = self._buffer
        elif self._state == "reasoning":
            out.reasoning = self._buffer
        self._buffer = ""
        return out
