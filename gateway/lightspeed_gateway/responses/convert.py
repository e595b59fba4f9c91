"""Responses input items: validated into one normal form (what the store keeps), then turned into
the renderer's messages.

Normal forms:
    {"type": "message", "role": "user"|"assistant"|"system"|"developer", "content": [{"type", "text"}]}
    {"type": "function_call", "call_id", "name", "arguments"}
    {"type": "function_call_output", "call_id", "output"}
    {"type": "reasoning", "summary", "content"}   (kept in history, not rendered: templates drop
                                                   earlier turns' reasoning)
A string content and a list of text parts render the same, so a client that re-sends a message in
the other form keeps its cached prefix.
"""

from __future__ import annotations

from typing import Any

from lightspeed_gateway.openai.errors import bad_request
from lightspeed_gateway.openai.protocol import ChatMessage, FunctionCall, FunctionDefinition, Tool, ToolCall
from lightspeed_gateway.responses.protocol import FunctionTool

TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
ROLES = {"user", "assistant", "system", "developer"}


def normalise_items(value: str | list[dict[str, Any]]) -> list[dict]:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": value}]}]
    return [_item(item, i) for i, item in enumerate(value)]


def _item(item: dict[str, Any], i: int) -> dict:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            raise bad_request(f"input[{i}].role must be one of {sorted(ROLES)}", f"input[{i}].role")
        part_type = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": _parts(item.get("content"), f"input[{i}].content",
                                                                   part_type)}
    if kind == "function_call":
        fields = _strings(item, i, "call_id", "name", "arguments")
        return {"type": "function_call", **fields}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = "".join(p["text"] for p in _parts(output, f"input[{i}].output", "input_text"))
        return {"type": "function_call_output", **_strings(item, i, "call_id"), "output": output}
    if kind == "reasoning":
        return {"type": "reasoning", "summary": list(item.get("summary") or []), "content": list(item.get("content")
                                                                                                  or [])}
    raise bad_request(f"input[{i}]: item type {kind!r} is not supported (messages, function_call, "
                      "function_call_output, reasoning)", f"input[{i}].type")


def _strings(item: dict[str, Any], i: int, *names: str) -> dict[str, str]:
    out = {}
    for name in names:
        value = item.get(name)
        if not isinstance(value, str):
            raise bad_request(f"input[{i}].{name} must be a string", f"input[{i}].{name}")
        out[name] = value
    return out


def _parts(content: Any, where: str, part_type: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": part_type, "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", where)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}[{j}]: content part {kind!r} is not supported by this model (text only)",
                              f"{where}[{j}]")
        parts.append({"type": kind, "text": part["text"]})
    return parts


def to_chat(items: list[dict], instructions: str | None) -> list[ChatMessage]:
    """The conversation as the renderer's messages; 400 for a function_call_output without its call."""
    messages = [ChatMessage(role="system", content=instructions)] if instructions else []
    calls: set[str] = set()
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append(ChatMessage(role=item["role"], content=text))
        elif kind == "function_call":
            call = ToolCall(id=item["call_id"], function=FunctionCall(name=item["name"], arguments=item["arguments"]))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and items[i - 1]["type"] in ("message", "function_call"):
                last.tool_calls = [*(last.tool_calls or []), call]  # one assistant turn: its text, then its calls
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
            calls.add(item["call_id"])
        elif kind == "function_call_output":
            if item["call_id"] not in calls:
                raise bad_request(f"No tool call found for function call output with call_id {item['call_id']!r}.",
                                  "input")
            messages.append(ChatMessage(role="tool", tool_call_id=item["call_id"], content=item["output"]))
    if not messages or all(m.role == "system" for m in messages):
        raise bad_request("input must contain at least one message", "input")
    return messages


def tools_of(tools: list[FunctionTool] | None) -> list[Tool] | None:
    if not tools:
        return None
    return [Tool.model_construct(type="function", function=FunctionDefinition.model_construct(
        name=t.name, description=t.description, parameters=t.parameters, strict=t.strict)) for t in tools]


def output_items_as_input(output: list[dict]) -> list[dict]:
    """A stored response's output items in the input normal form (ids and statuses dropped)."""
    items = []
    for item in output:
        if item["type"] == "message":
            items.append({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": p["text"]} for p in item["content"]]})
        elif item["type"] == "function_call":
            items.append({"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                          "arguments": item["arguments"]})
        elif item["type"] == "reasoning":
            items.append({"type": "reasoning", "summary": item.get("summary", []), "content": item.get("content", [])})
    return items

