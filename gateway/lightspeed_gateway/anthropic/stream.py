"""Anthropic's streaming events from parsed steps: content blocks opened and closed in order.

    message_start, ping, (content_block_start, content_block_delta*, content_block_stop)*,
    message_delta (stop_reason, usage), message_stop

A run of reasoning is a `thinking` block, a run of visible text a `text` block, each tool call a
`tool_use` block whose arguments stream as `input_json_delta` pieces.
"""

from __future__ import annotations

import json
from typing import Any

from lightspeed_gateway.parsers import ParsedDelta


def event(payload: dict) -> str:
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def tool_use_id(call_id: str) -> str:
    """Anthropic-style id for a parser's call id (`call_abc` -> `toolu_abc`)."""
    return "toolu_" + call_id.removeprefix("call_")


class BlockWriter:
    """Content-block events for a sequence of parsed deltas."""

    def __init__(self) -> None:
        self.index = -1
        self._open: tuple[str, int | None] | None = None  # (kind, tool index) of the open block
        self._tool_blocks: dict[int, int] = {}              # parser's call index -> block index

    def feed(self, delta: ParsedDelta) -> list[str]:
        out: list[str] = []
        if delta.reasoning:
            out += self._ensure(("thinking", None), {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta(self.index, {"type": "thinking_delta", "thinking": delta.reasoning}))
        if delta.content:
            out += self._ensure(("text", None), {"type": "text", "text": ""})
            out.append(self._delta(self.index, {"type": "text_delta", "text": delta.content}))
        for piece in delta.tool_calls:
            if piece.name is not None:
                out += self._ensure(("tool_use", piece.index), {"type": "tool_use", "id": tool_use_id(piece.id),
                                                                "name": piece.name, "input": {}})
                self._tool_blocks[piece.index] = self.index
            if piece.arguments and piece.index in self._tool_blocks:
                out.append(self._delta(self._tool_blocks[piece.index],
                                       {"type": "input_json_delta", "partial_json": piece.arguments}))
        return out

    def close(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [event({"type": "content_block_stop", "index": self.index})]

    def _ensure(self, kind: tuple[str, int | None], block: dict[str, Any]) -> list[str]:
        if self._open == kind:
            return []
        out = self.close()
        self.index += 1
        self._open = kind
        out.append(event({"type": "content_block_start", "index": self.index, "content_block": block}))
        return out

    @staticmethod
    def _delta(index: int, delta: dict) -> str:
        return event({"type": "content_block_delta", "index": index, "delta": delta})
