"""Anthropic request -> the renderer's messages and tools, normalised so the prompt prefix stays put.

Cache-busting noise that clients are known to send, and what we do with it (one test each):
- Claude Code's per-request first system block `x-anthropic-billing-header: cc_version=...;
  cc_entrypoint=...; cch=...;` (its `cch` changes every request, the version suffix every
  session): dropped, whether it is its own block or the first line of the system text. It is
  client analytics, not instructions.
- `cache_control` breakpoints, which Claude Code rolls forward every turn: never rendered, and a
  message's content renders the same as a string or as blocks, so moving a breakpoint (which also
  turns a string into a one-block list) changes nothing.
- System reminders (`<system-reminder>` text blocks, `role: "system"` turns inside messages):
  rendered where they stand, in order. Hoisting them into the leading system prompt, as some
  gateways do, shifts every following token each time one is added.
"""

from __future__ import annotations

import json
import re

from lightspeed_gateway.anthropic.protocol import (
    CountTokensRequest,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from lightspeed_gateway.openai.errors import bad_request
from lightspeed_gateway.openai.protocol import ChatMessage, FunctionDefinition, Tool

BILLING_HEADER = re.compile(r"\A\s*x-anthropic-billing-header:[^\n]*(\n|\Z)")
BLOCK_SEPARATOR = "\n"


def system_text(system: str | list[TextBlock] | None) -> str:
    """The system prompt without Claude Code's billing header."""
    if system is None:
        return ""
    texts = [system] if isinstance(system, str) else [block.text for block in system]
    kept = [BILLING_HEADER.sub("", text) for text in texts]
    return BLOCK_SEPARATOR.join(text for text in kept if text)


def to_chat(req: CountTokensRequest) -> tuple[list[ChatMessage], list[Tool] | None]:
    """The conversation as the renderer's messages, and the tools; 400 on what cannot be served."""
    messages: list[ChatMessage] = []
    system = system_text(req.system)
    if system:
        messages.append(ChatMessage(role="system", content=system))
    open_tool_uses: set[str] = set()  # ids of the previous assistant turn's tool_use blocks
    for index, message in enumerate(req.messages):
        blocks = [TextBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        if message.role == "assistant":
            messages.append(_assistant(blocks, index))
            open_tool_uses = {b.id for b in blocks if isinstance(b, ToolUseBlock)}
        else:
            messages += _user_or_system(message, blocks, index, open_tool_uses)
            open_tool_uses = set()
    return messages, _tools(req)


def _assistant(blocks: list, index: int) -> ChatMessage:
    texts, calls, thinking = [], [], []
    for block in blocks:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
        elif block.type != "redacted_thinking":
            raise bad_request(f"messages.{index}: {block.type} blocks are not allowed in assistant turns",
                              f"messages.{index}.content")
    return ChatMessage(role="assistant", content=BLOCK_SEPARATOR.join(texts) if texts or not calls else None,
                       tool_calls=calls or None, reasoning_content="".join(thinking) or None)


def _user_or_system(message: Message, blocks: list, index: int, open_tool_uses: set[str]) -> list[ChatMessage]:
    out, texts = [], []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            if message.role != "user" or block.tool_use_id not in open_tool_uses:
                raise bad_request(f"messages.{index}: tool_result block for tool_use_id {block.tool_use_id!r} has "
                                  "no matching tool_use block in the previous assistant message",
                                  f"messages.{index}.content")
            out.append(ChatMessage(role="tool", tool_call_id=block.tool_use_id, content=_result_text(block, index)))
        elif isinstance(block, TextBlock):
            texts.append(block.text)
        else:
            raise _unsupported(block, index)
    if texts:
        out.append(ChatMessage(role=message.role, content=BLOCK_SEPARATOR.join(texts)))
    return out


def _result_text(block: ToolResultBlock, index: int) -> str:
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    parts = []
    for part in block.content:
        if not isinstance(part, TextBlock):
            raise _unsupported(part, index)
        parts.append(part.text)
    return BLOCK_SEPARATOR.join(parts)


def _unsupported(block, index: int):
    what = "image" if isinstance(block, ImageBlock) else block.type
    return bad_request(f"messages.{index}: {what} blocks are not supported by this model (text only)",
                       f"messages.{index}.content")


def _tools(req: CountTokensRequest) -> list[Tool] | None:
    if not req.tools:
        return None
    # model_construct: Anthropic allows longer tool names than OpenAI's 64 characters.
    return [Tool.model_construct(type="function", function=FunctionDefinition.model_construct(
        name=t.name, description=t.description, parameters=t.input_schema, strict=None)) for t in req.tools]


def tool_mode(req: CountTokensRequest) -> tuple[str | None, str | None]:
    """(mode, name) for the output parsers: tools stay in the prompt whatever tool_choice says, so
    changing it does not change the cached prefix."""
    if not req.tools:
        return None, None
    choice = req.tool_choice.type if req.tool_choice is not None else "auto"
    if choice == "none":
        return None, None
    if choice == "any":
        return "required", None
    if choice == "tool":
        return "named", req.tool_choice.name
    return "auto", None
