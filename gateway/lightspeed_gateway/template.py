"""Chat template rendering whose token ids extend the previous turn's exactly.

Design note: agentic clients resend the whole conversation every turn; the prefix cache only helps
if turn k+1's prompt tokens start with turn k's. Tokenising the rendered string as a whole can
merge tokens across the boundary where new text was appended, so we render the conversation one
message at a time, check that each rendering extends the previous one (a property of sane
templates), and tokenise each appended piece on its own. The generation prompt of turn k
(`<|im_start|>assistant\\n`) is split off the front of turn k+1's assistant message the same way.
When a template breaks the prefix property (e.g. it rewrites earlier turns), we fall back to
tokenising the whole string: still correct, just fewer cache hits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightspeed_gateway.openai.protocol import ChatMessage, Tool

TOOL_SYSTEM_PROMPT = (
    "You may call functions to help with the user's request. The functions are:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with one or more blocks of the form\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n</tool_call>'
)


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file path or the template text itself."""
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and "{" not in value and path.is_file():
        return path.read_text()
    return value


@dataclass
class RenderedPrompt:
    text: str
    token_ids: list[int]
    prefix_stable: bool  # tokenised piece by piece (True) or as a whole (fallback)


class ChatRenderer:
    """Renders OpenAI messages with a tokenizer's (or an overriding) chat template."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError("the tokenizer has no chat template; pass --chat-template")
        self.template_knows_tools = "tools" in self.template

    # -- message conversion ----------------------------------------------------------------
    def to_dicts(self, messages: list[ChatMessage], tools: list[Tool] | None) -> list[dict]:
        out = []
        for message in messages:
            item: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                                    "content": message.text()}
            if message.tool_calls:
                calls = [{"id": c.id, "type": "function",
                          "function": {"name": c.function.name, "arguments": c.function.arguments}}
                         for c in message.tool_calls]
                if self.template_knows_tools:
                    item["tool_calls"] = calls
                else:
                    item["content"] += "".join(
                        f'<tool_call>\n{{"name": {json.dumps(c["function"]["name"])}, '
                        f'"arguments": {c["function"]["arguments"]}}}\n</tool_call>' for c in calls)
            if message.tool_call_id is not None:
                item["tool_call_id"] = message.tool_call_id
            if message.name is not None:
                item["name"] = message.name
            out.append(item)
        if tools and not self.template_knows_tools:
            spec = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
            note = TOOL_SYSTEM_PROMPT.format(tools=spec)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + note}
            else:
                out.insert(0, {"role": "system", "content": note})
        return out

    # -- rendering -------------------------------------------------------------------------
    def _render(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None,
                kwargs: dict[str, Any]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, chat_template=self.template, tokenize=False,
            add_generation_prompt=add_generation_prompt, **kwargs)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               template_kwargs: dict[str, Any] | None = None) -> RenderedPrompt:
        dicts = self.to_dicts(messages, tools)
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools and self.template_knows_tools else None
        kwargs = dict(template_kwargs or {})
        full = self._render(dicts, add_generation_prompt and not continue_final_message, tool_dicts, kwargs)
        if continue_final_message:
            final = dicts[-1]["content"]
            cut = full.rfind(final)
            if not final or cut < 0:
                raise ValueError("continue_final_message: the final message is not in the rendered prompt")
            full = full[: cut + len(final)]
            return RenderedPrompt(full, self._encode(full), False)
        token_ids = self._piecewise(dicts, full, tool_dicts, kwargs, add_generation_prompt)
        if token_ids is None:
            return RenderedPrompt(full, self._encode(full), False)
        return RenderedPrompt(full, token_ids, True)

    def _piecewise(self, dicts, full, tool_dicts, kwargs, add_generation_prompt) -> list[int] | None:
        token_ids: list[int] = []
        done = ""
        for i in range(1, len(dicts) + 1):
            rendered = self._render(dicts[:i], False, tool_dicts, kwargs)
            if not rendered.startswith(done):
                return None
            piece = rendered[len(done):]
            if dicts[i - 1]["role"] == "assistant" and i > 1:
                # Split off what turn i-1 had as its generation prompt, tokenised alone back then.
                with_prompt = self._render(dicts[: i - 1], True, tool_dicts, kwargs)
                gen_prompt = with_prompt[len(done):] if with_prompt.startswith(done) else ""
                if gen_prompt and piece.startswith(gen_prompt):
                    token_ids += self._encode(gen_prompt)
                    piece = piece[len(gen_prompt):]
            token_ids += self._encode(piece)
            done = rendered
        if not full.startswith(done):
            return None
        token_ids += self._encode(full[len(done):]) if add_generation_prompt else []
        if not add_generation_prompt and full != done:
            return None
        return token_ids
