"""Chat template rendering whose token ids extend the previous turn's exactly, incrementally.

Design note: agentic clients resend the whole conversation every turn; the prefix cache only helps
if turn k+1's prompt tokens start with turn k's. Tokenising the rendered string as a whole can
merge tokens across the boundary where new text was appended, so we render the conversation one
message at a time, check that each rendering extends the previous one (a property of sane
templates), and tokenise each appended piece on its own. The generation prompt of turn k
(`<|im_start|>assistant\\n`) is split off the front of turn k+1's assistant message the same way.
When a template breaks the prefix property (e.g. it rewrites earlier turns), we fall back to
tokenising the whole string: still correct, just fewer cache hits.

Incremental: the pieces of a conversation rendered before are remembered (`render_cache`), so a
turn renders and tokenises only its new messages: O(new messages) template calls and tokens, not
O(N) per turn. All new pieces are tokenised in one `encode_batch` call of the Rust tokenizer, which
releases the GIL; `render_async` runs the whole rendering in a worker thread, off the event loop.
One thread, by measurement (gateway/benchmarks/gateway_cpu.py): template rendering is Python and
holds the GIL, so a second thread adds event-loop lag without speed; a process pool lags less
under many concurrent cold renders but would need per-process caches with conversation affinity.
"""

from __future__ import annotations

import asyncio
import json
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightspeed_gateway.openai.protocol import ChatMessage, Tool
from lightspeed_gateway.render_cache import EMPTY, Boundary, RenderCache, canonical, prefix_keys

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
    reused_messages: int = 0  # leading messages whose tokens came from the render cache


class ChatRenderer:
    """Renders OpenAI messages with a tokenizer's (or an overriding) chat template.

    `cache_tokens` bounds the render cache (token ids remembered across requests; 0 turns it off),
    `workers` the threads `render_async` uses.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None, cache_tokens: int = 4_000_000,
                 workers: int = 1) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError("the tokenizer has no chat template; pass --chat-template")
        self.template_knows_tools = "tools" in self.template
        self.cache = RenderCache(cache_tokens)
        # The Rust tokenizer of a HF fast tokenizer: batch encoding releases the GIL.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="render")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def render_async(self, messages: list[ChatMessage], **kwargs: Any) -> RenderedPrompt:
        """`render` in a worker thread, so the event loop keeps serving streams meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: self.render(messages, **kwargs))

    async def encode_async(self, texts: list[str]) -> list[list[int]]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.encode_batch, texts)

    async def in_worker(self, fn: Any, *args: Any) -> Any:
        """Other tokenizer work of a request (encoding a prompt, decoding token ids) in the same threads."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

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

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens added), in one tokenizer call."""
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)] if texts else []
        return [list(self.tokenizer.encode(t, add_special_tokens=False)) if t else [] for t in texts]

    def _encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0] if text else []

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None = None,
               add_generation_prompt: bool = True, continue_final_message: bool = False,
               template_kwargs: dict[str, Any] | None = None) -> RenderedPrompt:
        dicts = self.to_dicts(messages, tools)
        tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools and self.template_knows_tools else None
        kwargs = dict(template_kwargs or {})
        if continue_final_message:
            full = self._render(dicts, False, tool_dicts, kwargs)
            final = dicts[-1]["content"]
            cut = full.rfind(final)
            if not final or cut < 0:
                raise ValueError("continue_final_message: the final message is not in the rendered prompt")
            full = full[: cut + len(final)]
            return RenderedPrompt(full, self._encode(full), False)
        return self._render_incrementally(dicts, tool_dicts, kwargs, add_generation_prompt)

    def _render_incrementally(self, dicts: list[dict], tool_dicts: list[dict] | None, kwargs: dict[str, Any],
                              add_generation_prompt: bool) -> RenderedPrompt:
        full = self._render(dicts, add_generation_prompt, tool_dicts, kwargs)
        keys = prefix_keys(canonical([self.template, tool_dicts, kwargs]), dicts)
        start, boundary = self.cache.longest(keys)
        extended = self._extend(dicts, start, boundary, tool_dicts, kwargs)
        if extended is None and start > 0:  # a remembered prefix that no longer extends: start over
            start, extended = 0, self._extend(dicts, 0, EMPTY, tool_dicts, kwargs)
        if extended is None or not full.startswith(extended[0]):
            return RenderedPrompt(full, self._encode(full), False)
        done, pieces = extended
        generation_prompt = full[len(done):]
        if not add_generation_prompt and generation_prompt:
            return RenderedPrompt(full, self._encode(full), False)
        encoded = self.encode_batch([*pieces, generation_prompt])
        token_ids = array("i", boundary.token_ids if start else ())
        for ids in encoded[:-1]:
            token_ids.extend(ids)
        self.cache.put(keys[-1], Boundary(done, token_ids, generation_prompt if add_generation_prompt else None),
                       supersedes=keys[start] if start else None)
        return RenderedPrompt(full, [*token_ids, *encoded[-1]], True, start)

    def _extend(self, dicts: list[dict], start: int, boundary: Boundary, tool_dicts: list[dict] | None,
                kwargs: dict[str, Any]) -> tuple[str, list[str]] | None:
        """Render messages start+1..N onto `boundary`: (text of all N, the new pieces to tokenise in
        order), or None when the template breaks the prefix property."""
        done, pieces = boundary.text, []
        for i in range(start + 1, len(dicts) + 1):
            rendered = self._render(dicts[:i], False, tool_dicts, kwargs)
            if not rendered.startswith(done):
                return None
            piece = rendered[len(done):]
            if dicts[i - 1]["role"] == "assistant" and i > 1:
                # Split off what turn i-1 had as its generation prompt, tokenised alone back then.
                if i - 1 == start and boundary.generation_prompt is not None:
                    gen_prompt = boundary.generation_prompt
                else:
                    with_prompt = self._render(dicts[: i - 1], True, tool_dicts, kwargs)
                    gen_prompt = with_prompt[len(done):] if with_prompt.startswith(done) else ""
                if gen_prompt and piece.startswith(gen_prompt):
                    pieces.append(gen_prompt)
                    piece = piece[len(gen_prompt):]
            pieces.append(piece)
            done = rendered
        return done, pieces
