"""POST /v1/chat/completions: template → tokens → engine → parsers → JSON or SSE."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from lightspeed_gateway.openai.errors import APIError, bad_request
from lightspeed_gateway.openai.protocol import ChatCompletionRequest, NamedToolChoice, new_id
from lightspeed_gateway.openai.serving import (
    ENGINE_ERRORS,
    SSE_DONE,
    CacheUsage,
    GatewayState,
    TokenText,
    cancel_on_disconnect,
    check_tools,
    engine_api_error,
    engine_error_events,
    first_then_rest,
    response_headers,
    sampling_params,
    sse,
    structured_output,
    token_logprobs,
    tool_grammar,
    usage_dict,
    vllm_structured_output,
)
from lightspeed_gateway.parsers import (
    REASONING_PARSERS,
    JsonStreamToolParser,
    NamedToolParser,
    ParsedDelta,
    make_tool_parser,
)
from lightspeed_gateway.server.engine import RequestTiming


class ChoiceParser:
    """Reasoning parser, then tool parser, over one choice's text deltas."""

    def __init__(self, state: GatewayState, tool_mode: str | None, tool_name: str | None,
                 starts_in_reasoning: bool) -> None:
        name = state.config.reasoning_parser
        self.reasoning = REASONING_PARSERS[name](starts_in_reasoning) if name else None
        self.tools = None
        if tool_mode == "auto":
            self.tools = make_tool_parser(state.config.tool_call_parser)
        elif tool_mode == "required":
            self.tools = JsonStreamToolParser()
        elif tool_mode == "named":
            self.tools = NamedToolParser(tool_name)
        self.content = self.reasoning_text = ""  # all the parsed deltas so far

    def feed(self, text: str) -> ParsedDelta:
        return self._seen(self._through_tools(self.reasoning.feed(text) if self.reasoning else ParsedDelta(content=text)))

    def finish(self) -> ParsedDelta:
        out = self._through_tools(self.reasoning.finish()) if self.reasoning else ParsedDelta()
        if self.tools is not None:
            tail = self.tools.finish()
            out.content += tail.content
            out.tool_calls += tail.tool_calls
        return self._seen(out)

    def _seen(self, parsed: ParsedDelta) -> ParsedDelta:
        self.content += parsed.content
        self.reasoning_text += parsed.reasoning
        return parsed

    def _through_tools(self, step: ParsedDelta) -> ParsedDelta:
        if self.tools is None or not step.content:
            return step
        parsed = self.tools.feed(step.content)
        parsed.reasoning = step.reasoning
        return parsed

    @property
    def tool_calls(self) -> list[dict]:
        return self.tools.tool_calls if self.tools is not None else []


def remember_plain_answer(state: GatewayState, parser: ChoiceParser, finish_reason: str | None,
                          token_ids: list[int]) -> None:
    """Let the next turn, which sends this answer back, reuse its generated token ids: a plain
    answer only (reasoning and tool calls are rendered back differently from how they came)."""
    if parser.content and not parser.reasoning_text and not parser.tool_calls and finish_reason in ("stop", "length"):
        state.renderer.remember_answer_soon(parser.content, token_ids)


def _tool_mode(req: ChatCompletionRequest) -> tuple[str | None, str | None]:
    if not req.tools or req.tool_choice == "none":
        return None, None
    if isinstance(req.tool_choice, NamedToolChoice):
        return "named", req.tool_choice.function.name
    if req.tool_choice == "required":
        return "required", None
    return "auto", None


def _structured(req: ChatCompletionRequest, tool_mode: str | None, tool_name: str | None) -> Any:
    """The request's output constraint: from tool_choice, response_format or vLLM's guided fields
    (400 when more than one asks)."""
    own = _own_structured(req, tool_mode, tool_name)
    extra = vllm_structured_output(req)
    if extra is None:
        return own
    if own is not None:
        raise bad_request(f"{extra[1]} cannot be combined with response_format or a forced tool_choice", extra[1])
    return extra[0]


def _own_structured(req: ChatCompletionRequest, tool_mode: str | None, tool_name: str | None) -> Any:
    if tool_mode in ("named", "required"):
        return tool_grammar(req.tools, tool_mode, tool_name, req.parallel_tool_calls)
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return structured_output(json_object=True)
    return structured_output(json_schema=fmt.json_schema.schema_)


def _finish_reason(reason: str | None, has_tool_calls: bool) -> str | None:
    if reason == "stop" and has_tool_calls:
        return "tool_calls"
    return reason


async def create_chat_completion(state: GatewayState, req: ChatCompletionRequest, raw: Request):
    state.check_model(req.model)
    check_tools(state, req.tools)
    tool_mode, tool_name = _tool_mode(req)
    try:
        prompt = await state.renderer.render_async(
            req.messages, tools=req.tools if tool_mode else None, add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message, template_kwargs=req.chat_template_kwargs)
    except APIError:
        raise
    except Exception as e:  # jinja errors, bad message sequences: the client's input
        raise bad_request(f"cannot apply the chat template: {e}", "messages") from None
    top_n = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(state, req, len(prompt.token_ids), req.max_completion_tokens or req.max_tokens, top_n,
                             _structured(req, tool_mode, tool_name),
                             max_tokens_param="max_completion_tokens" if req.max_completion_tokens else "max_tokens")
    headers = response_headers(state, req)
    state.admit(req.n)
    run = _ChatRun(state, req, prompt.token_ids, params, tool_mode, tool_name,
                   prompt.text.rstrip().endswith("<think>"))
    if req.stream:
        outputs = await run.first_output(raw)
        return StreamingResponse(run.stream(outputs), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
    return JSONResponse(await cancel_on_disconnect(raw, run.full()), headers=headers)


class _ChatRun:
    """One chat request in flight."""

    def __init__(self, state: GatewayState, req: ChatCompletionRequest, prompt_ids: list[int], params: Any,
                 tool_mode: str | None, tool_name: str | None, starts_in_reasoning: bool) -> None:
        self.state, self.req, self.prompt_ids, self.params = state, req, prompt_ids, params
        self.request_id = f"chatcmpl-{req.request_id}" if req.request_id else new_id("chatcmpl")
        self.created = int(time.time())
        self.timing = RequestTiming()
        self.parsers = [ChoiceParser(state, tool_mode, tool_name, starts_in_reasoning) for _ in range(req.n)]
        self.top_n = params.logprobs
        self.token_text = TokenText(state.engine.tokenizer) if self.top_n is not None else None
        self.completion_tokens = 0
        self.cache = CacheUsage()
        self.finish_reasons: list[str | None] = [None] * req.n
        self.answer_ids: list[list[int]] = [[] for _ in range(req.n)]

    def _logprob_items(self, completion: Any) -> list[dict]:
        items = []
        for token_id, entry in zip(completion.token_ids, completion.logprobs or (), strict=False):
            chosen, top = token_logprobs(entry, token_id, self.top_n, self.token_text)
            text = self.token_text(token_id)
            items.append({"token": text, "logprob": chosen, "bytes": list(text.encode()),
                          "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top]})
        return items

    def _observe(self) -> None:
        self.state.metrics.observe_request(self.timing, len(self.prompt_ids), self.completion_tokens,
                                           self.cache.tokens, [r for r in self.finish_reasons if r])

    async def full(self) -> dict:
        texts: list[list[str]] = [[] for _ in range(self.req.n)]
        logprobs: list[list[dict]] = [[] for _ in range(self.req.n)]
        try:
            async for out in self.state.engine.generate(self.prompt_ids, self.params, self.request_id, self.timing,
                                                        self.req.priority, session=self.req.prompt_cache_key):
                self.cache.add(out)
                for c in out.outputs:
                    texts[c.index].append(c.text)
                    self.answer_ids[c.index] += c.token_ids
                    self.completion_tokens += len(c.token_ids)
                    if self.top_n is not None:
                        logprobs[c.index] += self._logprob_items(c)
                    if c.finish_reason is not None:
                        self.finish_reasons[c.index] = c.finish_reason
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None
        choices = []
        for i, parser in enumerate(self.parsers):
            first, last = parser.feed("".join(texts[i])), parser.finish()
            content = first.content + last.content
            reasoning = first.reasoning + last.reasoning
            calls = parser.tool_calls
            message = {"role": "assistant", "content": content if content or not calls else None,
                       "tool_calls": [{"id": c["id"], "type": "function",
                                       "function": {"name": c["name"], "arguments": c["arguments"]}}
                                      for c in calls] or None}
            if reasoning:
                message["reasoning_content"] = reasoning
            remember_plain_answer(self.state, parser, self.finish_reasons[i], self.answer_ids[i])
            self.finish_reasons[i] = _finish_reason(self.finish_reasons[i], bool(calls))
            choices.append({"index": i, "message": message, "finish_reason": self.finish_reasons[i],
                            "logprobs": {"content": logprobs[i]} if self.top_n is not None else None})
        self._observe()
        return {"id": self.request_id, "object": "chat.completion", "created": self.created,
                "model": self.state.model_name, "choices": choices,
                "usage": usage_dict(len(self.prompt_ids), self.completion_tokens, self.cache)}

    def _chunk(self, choices: list[dict], usage: Any = ...) -> str:
        payload = {"id": self.request_id, "object": "chat.completion.chunk", "created": self.created,
                   "model": self.state.model_name, "choices": choices}
        options = self.req.stream_options
        if usage is not ...:
            payload["usage"] = usage
        elif options is not None and options.include_usage:
            payload["usage"] = (usage_dict(len(self.prompt_ids), self.completion_tokens, self.cache)
                                if options.continuous_usage_stats else None)
        return sse(payload)

    def _delta_choice(self, index: int, parsed: ParsedDelta, completion: Any) -> dict | None:
        delta: dict[str, Any] = {}
        if parsed.content:
            delta["content"] = parsed.content
        if parsed.reasoning:
            delta["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            delta["tool_calls"] = [_tool_call_delta(t) for t in parsed.tool_calls]
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        if self.top_n is not None and completion.logprobs:
            choice["logprobs"] = {"content": self._logprob_items(completion)}
        if completion.finish_reason is not None:
            reason = _finish_reason(completion.finish_reason, bool(self.parsers[index].tool_calls))
            self.finish_reasons[index] = choice["finish_reason"] = reason
        elif not delta and choice["logprobs"] is None:
            return None
        return choice

    async def first_output(self, raw: Request) -> AsyncIterator[Any]:
        """The engine's outputs, started: rejection and engine death surface here as status codes."""
        outputs = self.state.engine.generate(self.prompt_ids, self.params, self.request_id, self.timing,
                                             self.req.priority, session=self.req.prompt_cache_key)
        try:
            return await first_then_rest(outputs, raw)
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None

    async def stream(self, outputs: AsyncIterator[Any]) -> AsyncIterator[str]:
        try:
            yield self._chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None} for i in range(self.req.n)])
            async for out in outputs:
                self.cache.add(out)
                choices = []
                for c in out.outputs:
                    self.completion_tokens += len(c.token_ids)
                    self.answer_ids[c.index] += c.token_ids
                    parser = self.parsers[c.index]
                    parsed = parser.feed(c.text) if c.text else ParsedDelta()
                    if c.finish_reason is not None:
                        tail = parser.finish()
                        parsed.content += tail.content
                        parsed.reasoning += tail.reasoning
                        parsed.tool_calls += tail.tool_calls
                    choice = self._delta_choice(c.index, parsed, c)
                    if choice is not None:
                        choices.append(choice)
                if choices:
                    yield self._chunk(choices)
            for i, parser in enumerate(self.parsers):
                remember_plain_answer(self.state, parser, self.finish_reasons[i], self.answer_ids[i])
            options = self.req.stream_options
            if options is not None and options.include_usage:
                yield self._chunk([], usage_dict(len(self.prompt_ids), self.completion_tokens, self.cache))
            self._observe()
            yield SSE_DONE
        except ENGINE_ERRORS as e:
            for event in engine_error_events(self.state, e):
                yield event


def _tool_call_delta(piece: Any) -> dict:
    function: dict[str, Any] = {"arguments": piece.arguments}
    item: dict[str, Any] = {"index": piece.index, "function": function}
    if piece.id is not None:
        item["id"], item["type"] = piece.id, "function"
    if piece.name is not None:
        function["name"] = piece.name
    return item
