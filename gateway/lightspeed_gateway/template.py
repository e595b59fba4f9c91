"""Chat template rendering whose token ids extend the previous turn's exactly, incrementally.

Design note: agentic clients resend the whole conversation every turn; the prefix cache only helps
if turn k+1's prompt tokens start with turn k's. Tokenising the rendered string as a whole can
merge tokens across the boundary where new text was appended, so we render the conversation one
message at a time, check that each rendering extends the previous one (a property of sane
templates), and tokenise each appended piece on its own. The generation prompt of turn k
(`<|im_start|>assistant\\n`) is split off the front of turn k+1's assistant message the same way.
When a template breaks the prefix property (e.g. it rewrites earlier turns), we fall back to
tokenising the whole string: still correct, just fewer cache hits. An assistant message whose text
is an answer this server generated takes the generated token ids (`AnswerTokens`), not a fresh
tokenisation of its text, so the cache keeps matching through the previous answer.

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
import threading
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightspeed_gateway.openai.protocol import ChatMessage, Tool
from lightspeed_gateway.render_cache import EMPTY, AnswerTokens, Boundary, RenderCache, canonical, prefix_keys

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
    generated_answers: int = 0  # assistant messages that took the ids the engine generated for them


Piece = str | array  # text still to tokenise, or token ids already known (a generated answer)


class ChatRenderer:
    """Renders OpenAI messages with a tokenizer's (or an overriding) chat template.

    `cache_tokens` bounds the render cache (token ids remembered across requests; 0 turns it off),
    `answer_tokens` the generated answers remembered (`remember_answer`; 0 turns it off), `workers`
    the threads `render_async` uses.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None, cache_tokens: int = 4_000_000,
                 workers: int = 1, answer_tokens: int = 2_000_000) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError("the tokenizer has no chat template; pass --chat-template")
        self.template_knows_tools = "tools" in self.template
        self.cache = RenderCache(cache_tokens)
        self.answers = AnswerTokens(answer_tokens)
        # Generated answers: remembered / refused (ids that do not decode to the text) / spliced into a
        # later prompt. Read by the /metrics collector; written by the render threads.
        self.answer_counts = {"remembered": 0, "refused": 0, "spliced": 0}
        self._counts_lock = threading.Lock()
        self._special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
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

    def remember_answer_soon(self, text: str, token_ids: list[int]) -> None:
        """Queue `remember_answer` on the render thread: with one worker it runs before the
        rendering of any request that arrives after this call (the executor is FIFO)."""
        if self.answers.max_tokens and text and token_ids:
            self._pool.submit(self.remember_answer, text, list(token_ids))

    def remember_answer(self, text: str, token_ids: list[int]) -> bool:
        """Remember that the engine generated `token_ids` for the answer `text`, if they decode to
        exactly that text once trailing special tokens (the EOS the template renders itself) are
        dropped. An answer cut by a stop string, or with special tokens skipped inside it, does not
        decode to its text and is not remembered. Returns whether it was."""
        ids = list(token_ids)
        while ids and ids[-1] in self._special_ids:
            ids.pop()
        remembered = bool(ids) and self._decode(ids) == text
        if remembered:
            self.answers.put(text, ids)
        self._count("remembered" if remembered else "refused")
        return remembered

    def _count(self, outcome: str, n: int = 1) -> None:
        with self._counts_lock:
            self.answer_counts[outcome] += n

    def _decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

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
        encoded = iter(self.encode_batch([p for p in pieces if isinstance(p, str)] + [generation_prompt]))
        token_ids = array("i", boundary.token_ids if start else ())
        for piece in pieces:
            token_ids.extend(next(encoded) if isinstance(piece, str) else piece)
        self.cache.put(keys[-1], Boundary(done, token_ids, generation_prompt if add_generation_prompt else None),
                       supersedes=keys[start] if start else None)
        answers = sum(not isinstance(p, str) for p in pieces)
        if answers:
            self._count("spliced", answers)
        return RenderedPrompt(full, [*token_ids, *next(encoded)], True, start, answers)

    def _extend(self, dicts: list[dict], start: int, boundary: Boundary, tool_dicts: list[dict] | None,
                kwargs: dict[str, Any]) -> tuple[str, list[Piece]] | None:
        """Render messages start+1..N onto `boundary`: (text of all N, the new pieces in order: text
        to tokenise, or a generated answer's ids), or None when the template breaks the prefix property."""
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
            if dicts[i - 1]["role"] == "assistant":
                content = dicts[i - 1].get("content")
                generated = self.answers.get(content) if isinstance(content, str) and piece.startswith(content) else None
                if generated is not None:
                    pieces.append(generated)
                    piece = piece[len(content):]
            pieces.append(piece)
            done = rendered
        return done, pieces
