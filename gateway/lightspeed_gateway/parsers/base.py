"""Types shared by the streaming parsers, and the JSON scanner the tool parsers build on."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ToolCallDelta:
    """One piece of one tool call, in OpenAI's streaming shape.

    `id` and `name` come once, in the first delta of a call; `arguments` is a piece of the raw JSON
    text of the arguments, to be concatenated in order.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    """What one fed text delta made certain: visible content, reasoning, tool-call pieces."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


def random_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def counter_call_ids(prefix: str = "call_") -> Callable[[], str]:
    """Deterministic ids for tests, so two parses of the same text compare equal."""
    counter = itertools.count()
    return lambda: f"{prefix}{next(counter)}"


def split_partial_tag(buffer: str, tag: str) -> tuple[str, str]:
    """Split `buffer` into (safe, held): `held` is the longest suffix that is a proper prefix of `tag`.

    Text that might be the start of `tag` is held back until the next delta decides it.
    """
    for keep in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if tag.startswith(buffer[-keep:]):
            return buffer[:-keep], buffer[-keep:]
    return buffer, ""


class ToolParser:
    """Interface of a streaming tool-call parser (one instance per choice of a request)."""

    def feed(self, text: str) -> ParsedDelta:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> ParsedDelta:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def tool_calls(self) -> list[dict]:  # pragma: no cover - interface
        raise NotImplementedError


def collect(deltas: list[ParsedDelta]) -> dict:
    """Fold a delta sequence into {content, reasoning, tool_calls:[{id,name,arguments}]}; for tests
    and for the non-streaming response."""
    content, reasoning, calls = [], [], {}
    for delta in deltas:
        content.append(delta.content)
        reasoning.append(delta.reasoning)
        for piece in delta.tool_calls:
            call = calls.setdefault(piece.index, {"id": None, "name": None, "arguments": ""})
            if piece.id is not None:
                call["id"] = piece.id
            if piece.name is not None:
                call["name"] = piece.name
            call["arguments"] += piece.arguments
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning),
        "tool_calls": [calls[i] for i in sorted(calls)],
    }
