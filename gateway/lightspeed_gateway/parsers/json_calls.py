"""Incremental scanner for a stream of JSON tool-call objects.

Design note: tool calls arrive as `{"name": "f", "arguments": {...}}` objects, alone (hermes, inside
tags), separated by `;` (llama3_json) or as the items of a JSON array (tool_choice=required). The
scanner walks characters once, tracking string/escape state and bracket depth, so it never
re-parses the growing buffer. It emits the call's name as soon as its string closes and streams the
raw text of the arguments object as it arrives: concatenating the pieces gives the exact JSON text
the model wrote, whatever the split points were.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from lightspeed_gateway.parsers.base import ToolCallDelta

ARGUMENT_KEYS = ("arguments", "parameters")
_SEPARATORS = " \t\r\n;,[]"


class _Call:
    """A call being scanned: what has been emitted and what waits for the name."""

    def __init__(self) -> None:
        self.raw: list[str] = []
        self.name: str | None = None
        self.index: int | None = None
        self.pending_args: list[str] = []
        self.args_seen = False
        self.string_args: str | None = None


class JsonCallScanner:
    """Feed characters of zero or more top-level JSON objects; get ToolCallDelta pieces back."""

    def __init__(self, new_call_id: Callable[[], str], first_index: int = 0) -> None:
        self._new_call_id = new_call_id
        self.next_index = first_index
        self.calls: list[dict] = []  # finished or started calls: {id, name, arguments, valid}
        self.junk = False  # a non-separator character outside any object
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._slot = "key"  # depth-1 position: key | in_key | colon | value | in_value | after
        self._key: list[str] = []
        self._value: list[str] = []
        self._value_kind = ""  # container | string | scalar
        self._call: _Call | None = None
        self._out: list[ToolCallDelta] = []

    # -- public --------------------------------------------------------------------------
    def feed(self, text: str) -> list[ToolCallDelta]:
        for ch in text:
            self._step(ch)
        out, self._out = self._out, []
        return _coalesce(out)

    @property
    def inside_object(self) -> bool:
        return self._depth > 0

    # -- character machine ---------------------------------------------------------------
    def _step(self, ch: str) -> None:
        if self._depth == 0:
            if ch == "{":
                self._call = _Call()
                self._call.raw.append(ch)
                self._depth, self._slot = 1, "key"
            elif ch not in _SEPARATORS:
                self.junk = True
            return
        call = self._call
        call.raw.append(ch)
        if self._in_string:
            self._string_char(ch)
            return
        if ch == '"':
            self._in_string = True
            if self._depth == 1 and self._slot == "key":
                self._slot, self._key = "in_key", []
                return
            if self._depth == 1 and self._slot == "value":
                self._start_value("string")
            self._capture(ch)
            return
        if ch in "{[":
            if self._depth == 1 and self._slot == "value":
                self._start_value("container")
            self._depth += 1
            self._capture(ch)
            return
        if ch in "}]":
            self._depth -= 1
            if self._depth >= 1:
                self._capture(ch)
                if self._depth == 1 and self._value_kind == "container":
                    self._end_value()
                return
            if self._slot == "in_value":
                self._end_value()
            self._close_object()
            return
        if self._depth > 1:
            self._capture(ch)
            return
        # depth 1, outside strings and brackets
        if ch == ":" and self._slot == "colon":
            self._slot = "value"
        elif ch == ",":
            if self._slot == "in_value":
                self._end_value()
            self._slot = "key"
        elif ch in " \t\r\n":
            if self._slot == "in_value":
                self._value.append(ch)
        elif self._slot == "value":
            self._start_value("scalar")
            self._value.append(ch)
        elif self._slot == "in_value":
            self._value.append(ch)

    def _string_char(self, ch: str) -> None:
        closing = ch == '"' and not self._escape
        self._escape = ch == "\\" and not self._escape
        if self._depth == 1 and self._slot == "in_key":
            if closing:
                self._in_string, self._slot = False, "colon"
            else:
                self._key.append(ch)
            return
        self._capture(ch)
        if closing:
            self._in_string = False
            if self._depth == 1 and self._value_kind == "string":
                self._end_value()

    def _start_value(self, kind: str) -> None:
        self._slot, self._value_kind, self._value = "in_value", kind, []
        if kind == "container" and self._key_name() in ARGUMENT_KEYS:
            self._call.args_seen = True

    def _capture(self, ch: str) -> None:
        if self._slot != "in_value":
            return
        self._value.append(ch)
        if self._value_kind == "container" and self._key_name() in ARGUMENT_KEYS:
            self._emit_args(ch)

    def _key_name(self) -> str:
        return "".join(self._key)

    def _end_value(self) -> None:
        key, raw, kind = self._key_name(), "".join(self._value).strip(), self._value_kind
        self._slot, self._value_kind, self._value = "after", "", []
        call = self._call
        if key == "name" and kind == "string" and call.name is None:
            try:
                name = json.loads(raw)
            except ValueError:
                return
            if isinstance(name, str):
                self._emit_name(name)
        elif key in ARGUMENT_KEYS and kind != "container" and not call.args_seen:
            # Arguments written as a JSON-encoded string (or a scalar): not streamable, emit whole.
            call.args_seen = True
            try:
                value = json.loads(raw)
            except ValueError:
                value = raw
            self._emit_args(value if isinstance(value, str) else json.dumps(value))

    def _emit_name(self, name: str) -> None:
        call = self._call
        call.name, call.index = name, self.next_index
        self.next_index += 1
        call_id = self._new_call_id()
        self.calls.append({"id": call_id, "name": name, "arguments": "", "valid": False})
        self._out.append(ToolCallDelta(index=call.index, id=call_id, name=name))
        if call.pending_args:
            self._emit_args("".join(call.pending_args))
            call.pending_args = []

    def _emit_args(self, text: str) -> None:
        call = self._call
        if call.index is None:
            call.pending_args.append(text)
            return
        self.calls[-1]["arguments"] += text
        self._out.append(ToolCallDelta(index=call.index, arguments=text))

    def _close_object(self) -> None:
        call = self._call
        if call.index is not None:
            if not call.args_seen:
                self._emit_args("{}")
            try:
                json.loads("".join(call.raw))
                self.calls[-1]["valid"] = True
            except ValueError:
                pass
        self._call, self._slot, self._key = None, "key", []


def _coalesce(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Merge consecutive argument pieces of one call, so a big delta yields few SSE pieces."""
    merged: list[ToolCallDelta] = []
    for delta in deltas:
        last = merged[-1] if merged else None
        if last is not None and last.index == delta.index and delta.id is None and delta.name is None:
            last.arguments += delta.arguments
        else:
            merged.append(ToolCallDelta(delta.index, delta.id, delta.name, delta.arguments))
    return merged
