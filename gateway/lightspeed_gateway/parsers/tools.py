"""Tool-call parsers: `hermes` (`<tool_call>{json}</tool_call>`, Qwen family), `llama3_json`
(`{"name": ..., "parameters": ...}` objects, optionally after `<|python_tag|>`, `;`-separated) and
the plain JSON stream used when tool_choice=required forces an array of calls."""

from __future__ import annotations

from collections.abc import Callable

from lightspeed_gateway.parsers.base import ParsedDelta, ToolParser, random_call_id, split_partial_tag
from lightspeed_gateway.parsers.json_calls import JsonCallScanner


def _public(calls: list[dict], *, open_too: bool = False) -> list[dict]:
    return [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in calls if open_too or c["valid"]]


class HermesToolParser(ToolParser):
    """Text outside `<tool_call>` tags is content; whitespace after the first call is dropped."""

    OPEN, CLOSE = "<tool_call>", "</tool_call>"

    def __init__(self, new_call_id: Callable[[], str] = random_call_id) -> None:
        self._scanner = JsonCallScanner(new_call_id)
        self._buffer = ""
        self._in_call = False
        self._seen_call = False

    def feed(self, text: str) -> ParsedDelta:
        self._buffer += text
        out = ParsedDelta()
        while True:
            if self._in_call:
                end = self._buffer.find(self.CLOSE)
                if end < 0:
                    safe, self._buffer = split_partial_tag(self._buffer, self.CLOSE)
                    out.tool_calls += self._scanner.feed(safe)
                    return out
                out.tool_calls += self._scanner.feed(self._buffer[:end])
                self._buffer = self._buffer[end + len(self.CLOSE) :]
                self._in_call = False
                continue
            start = self._buffer.find(self.OPEN)
            if start >= 0:
                out.content += self._content(self._buffer[:start], final=True)
                self._buffer = self._buffer[start + len(self.OPEN) :]
                self._in_call = self._seen_call = True
                continue
            safe, held = split_partial_tag(self._buffer, self.OPEN)
            if self._seen_call and not safe.strip():
                return out  # keep whitespace (and any partial tag) until something decides it
            out.content += self._content(safe, final=False)
            self._buffer = held
            return out

    def _content(self, text: str, final: bool) -> str:
        if self._seen_call and not text.strip():
            return ""
        return text

    def finish(self) -> ParsedDelta:
        out = ParsedDelta()
        if not self._in_call and self._buffer and not (self._seen_call and not self._buffer.strip()):
            out.content = self._buffer
        elif self._in_call:
            out.tool_calls = self._scanner.feed(self._buffer)
        self._buffer = ""
        return out

    @property
    def tool_calls(self) -> list[dict]:
        return _public(self._scanner.calls)


class JsonStreamToolParser(ToolParser):
    """The whole output is JSON call objects (an array, or `;`-separated): no content at all. If the
    output ends before any call's name was read (cut at max_tokens), its text comes back as content:
    nothing the model wrote is dropped."""

    def __init__(self, new_call_id: Callable[[], str] = random_call_id) -> None:
        self._scanner = JsonCallScanner(new_call_id)
        self._raw: list[str] = []

    def feed(self, text: str) -> ParsedDelta:
        self._raw.append(text)
        return ParsedDelta(tool_calls=self._scanner.feed(text))

    def finish(self) -> ParsedDelta:
        if self._scanner.calls:
            return ParsedDelta()
        return ParsedDelta(content="".join(self._raw))

    @property
    def tool_calls(self) -> list[dict]:
        # the grammar makes every call well formed, so one left open was cut at max_tokens: it is kept
        # with the arguments written so far (finish_reason "length" says so), as the stream showed it
        return _public(self._scanner.calls, open_too=True)


class Llama3JsonToolParser(ToolParser):
    """Calls only when the output starts (after whitespace) with `{` or `<|python_tag|>`; otherwise
    everything is content. If no call could be read by the end, the text comes back as content."""

    TAG = "<|python_tag|>"

    def __init__(self, new_call_id: Callable[[], str] = random_call_id) -> None:
        self._scanner = JsonCallScanner(new_call_id)
        self._mode = "start"  # start | json | content
        self._buffer = ""
        self._raw: list[str] = []

    def feed(self, text: str) -> ParsedDelta:
        self._raw.append(text)
        if self._mode == "content":
            return ParsedDelta(content=text)
        if self._mode == "json":
            return ParsedDelta(tool_calls=self._scanner.feed(text))
        self._buffer += text
        head = self._buffer.lstrip()
        if not head or (self.TAG.startswith(head) and head != self.TAG):
            return ParsedDelta()
        if head.startswith(self.TAG):
            self._mode = "json"
            return ParsedDelta(tool_calls=self._scanner.feed(head[len(self.TAG) :]))
        if head.startswith("{"):
            self._mode = "json"
            return ParsedDelta(tool_calls=self._scanner.feed(head))
        self._mode = "content"
        return ParsedDelta(content=self._buffer)

    def finish(self) -> ParsedDelta:
        if self._mode == "start":
            return ParsedDelta(content=self._buffer)
        if self._mode == "json" and not self._scanner.calls:
            return ParsedDelta(content="".join(self._raw))
        return ParsedDelta()

    @property
    def tool_calls(self) -> list[dict]:
        return _public(self._scanner.calls)


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
}


def make_tool_parser(name: str, new_call_id: Callable[[], str] = random_call_id) -> ToolParser:
    try:
        return TOOL_PARSERS[name](new_call_id)
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose from {sorted(TOOL_PARSERS)}") from None


class NamedToolParser(ToolParser):
    """tool_choice names one function: the whole (grammar-constrained) output is its arguments."""

    def __init__(self, name: str, new_call_id: Callable[[], str] = random_call_id) -> None:
        self._name = name
        self._id = new_call_id()
        self._arguments: list[str] = []

    def feed(self, text: str) -> ParsedDelta:
        from lightspeed_gateway.parsers.base import ToolCallDelta

        first = not self._arguments
        self._arguments.append(text)
        if first:
            return ParsedDelta(tool_calls=[ToolCallDelta(0, self._id, self._name, text)])
        return ParsedDelta(tool_calls=[ToolCallDelta(0, arguments=text)]) if text else ParsedDelta()

    def finish(self) -> ParsedDelta:
        if not self._arguments:
            return self.feed("")
        return ParsedDelta()

    @property
    def tool_calls(self) -> list[dict]:
        return [{"id": self._id, "name": self._name, "arguments": "".join(self._arguments)}]
