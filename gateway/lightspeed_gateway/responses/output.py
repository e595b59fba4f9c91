"""Output items from parsed steps, and the Responses streaming events that announce them.

One builder serves both modes: streaming sends the events `feed` and `close` return, a plain
request ignores them; either way `items` ends as the response's `output`. A run of reasoning is a
`reasoning` item, a run of text a `message` item, each tool call a `function_call` item:

    output_item.added, content_part.added, (output_text | reasoning_text).delta*, *.done,
    content_part.done, output_item.done          (function calls: function_call_arguments.*)
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from lightspeed_gateway.parsers import ParsedDelta


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputBuilder:
    def __init__(self) -> None:
        self.items: list[dict] = []
        self.sequence = 0
        self._open: dict | None = None        # the item being written
        self._open_key: tuple | None = None   # ("reasoning"|"message", None) or ("function_call", index)
        self._text = ""

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"

    @property
    def output_index(self) -> int:
        return len(self.items) - 1

    def feed(self, delta: ParsedDelta) -> list[str]:
        out: list[str] = []
        if delta.reasoning:
            out += self._ensure(("reasoning", None), {"type": "reasoning", "id": item_id("rs"), "summary": [],
                                                      "content": [], "status": "in_progress"},
                                {"type": "reasoning_text", "text": ""})
            out.append(self._text_delta("response.reasoning_text.delta", delta.reasoning))
        if delta.content:
            out += self._ensure(("message", None), {"type": "message", "id": item_id("msg"), "status": "in_progress",
                                                    "role": "assistant", "content": []},
                                {"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            out.append(self._text_delta("response.output_text.delta", delta.content))
        for piece in delta.tool_calls:
            if piece.name is not None:
                out += self._ensure(("function_call", piece.index), {
                    "type": "function_call", "id": item_id("fc"), "call_id": piece.id, "name": piece.name,
                    "arguments": "", "status": "in_progress"}, None)
            if piece.arguments and self._open_key == ("function_call", piece.index):
                self._text += piece.arguments
                out.append(self.event("response.function_call_arguments.delta", item_id=self._open["id"],
                                      output_index=self.output_index, delta=piece.arguments))
        return out

    def ensure_output(self) -> list[str]:
        """An empty message item when the model said nothing (a response always has output)."""
        if self.items:
            return []
        return self._ensure(("message", None), {"type": "message", "id": item_id("msg"), "status": "in_progress",
                                                "role": "assistant", "content": []},
                            {"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def close(self, status: str = "completed") -> list[str]:
        """Finish the open item (`status` "incomplete" when the output was cut at max_output_tokens)."""
        item, key = self._open, self._open_key
        if item is None:
            return []
        self._open = self._open_key = None
        where = {"item_id": item["id"], "output_index": self.output_index}
        item["status"] = status
        if key[0] == "function_call":
            item["arguments"] = self._text
            done = [self.event("response.function_call_arguments.done", **where, arguments=self._text)]
        else:
            kind = "reasoning_text" if key[0] == "reasoning" else "output_text"
            part = {"type": kind, "text": self._text}
            if kind == "output_text":
                part.update(annotations=[], logprobs=[])
            item["content"] = [part]
            done = [self.event(f"response.{kind}.done", **where, content_index=0, text=self._text),
                    self.event("response.content_part.done", **where, content_index=0, part=part)]
        return [*done, self.event("response.output_item.done", output_index=self.output_index, item=item)]

    def _ensure(self, key: tuple, item: dict, part: dict | None) -> list[str]:
        if self._open_key == key:
            return []
        out = self.close()
        self.items.append(item)
        self._open, self._open_key, self._text = item, key, ""
        out.append(self.event("response.output_item.added", output_index=self.output_index, item=item))
        if part is not None:
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=self.output_index,
                                  content_index=0, part=part))
        return out

    def _text_delta(self, kind: str, text: str) -> str:
        self._text += text
        fields = {"logprobs": []} if kind == "response.output_text.delta" else {}
        return self.event(kind, item_id=self._open["id"], output_index=self.output_index, content_index=0,
                          delta=text, **fields)
