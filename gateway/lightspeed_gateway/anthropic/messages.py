"""POST /v1/messages and /v1/messages/count_tokens: Anthropic semantics over the shared renderer.

Usage follows Anthropic's contract, input = input_tokens + cache_read_input_tokens +
cache_creation_input_tokens: cache reads are the engine's prefix-cache hits, cache creation the
prompt's full pages it computed and now keeps, input_tokens the partial last page.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lightspeed_gateway.anthropic.convert import to_chat, tool_mode
from lightspeed_gateway.anthropic.errors import AnthropicRoute, error_body
from lightspeed_gateway.anthropic.protocol import CountTokensRequest, ErrorResponse, MessagesRequest
from lightspeed_gateway.anthropic.stream import BlockWriter, event, tool_use_id
from lightspeed_gateway.generation import Generation
from lightspeed_gateway.openai.errors import APIError, bad_request
from lightspeed_gateway.openai.protocol import SamplingFields, Tool
from lightspeed_gateway.openai.serving import (
    ENGINE_ERRORS,
    GatewayState,
    cancel_on_disconnect,
    check_tools,
    engine_api_error,
    sampling_params,
    structured_output,
    tool_grammar,
)
from lightspeed_gateway.template import RenderedPrompt

_ERRORS = {code: {"model": ErrorResponse, "description": text} for code, text in (
    (400, "Invalid request"), (401, "Invalid or missing API key"), (404, "Unknown model"),
    (413, "Request body too large"), (429, "Too many waiting requests (see Retry-After)"),
    (503, "Engine not running (see Retry-After)"))}
_STREAM = {200: {"content": {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON event"}, "event": {"type": "string"}}}}},
                 "description": "A Message, or with stream=true Anthropic's server-sent events"}}
router = APIRouter(route_class=AnthropicRoute, tags=["anthropic"], responses=_ERRORS)


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway


async def render(state: GatewayState, req: CountTokensRequest) -> tuple[RenderedPrompt, list[Tool] | None]:
    """The prompt of a Messages request, and its tools. A final assistant turn is a prefill: the
    reply continues it."""
    messages, tools = to_chat(req)
    prefill = messages[-1].role == "assistant" and not messages[-1].tool_calls
    kwargs = None
    if req.thinking is not None:
        kwargs = {"enable_thinking": req.thinking.type != "disabled"}
    try:
        prompt = await state.renderer.render_async(messages, tools=tools, add_generation_prompt=not prefill,
                                                   continue_final_message=prefill, template_kwargs=kwargs)
    except APIError:
        raise
    except Exception as e:  # jinja errors, message orders the template refuses: the client's input
        raise bad_request(f"cannot apply the chat template: {e}", "messages") from None
    return prompt, tools


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict:
    state = _state(request)
    state.check_model(body.model)
    prompt, _ = await render(state, body)
    return {"input_tokens": len(prompt.token_ids)}


@router.post("/v1/messages", responses=_STREAM)
async def create_message(body: MessagesRequest, request: Request):
    state = _state(request)
    state.check_model(body.model)
    check_tools(state, body.tools)
    prompt, tools = await render(state, body)
    mode, name = tool_mode(body)
    parallel = not (body.tool_choice and body.tool_choice.disable_parallel_tool_use)
    fields = SamplingFields(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                            stop=body.stop_sequences or None)
    structured = tool_grammar(tools, mode, name, parallel) if tools else None
    if structured is None and body.output_config is not None and body.output_config.format is not None:
        structured = structured_output(json_schema=body.output_config.format.schema_)
    params = sampling_params(state, fields, len(prompt.token_ids), body.max_tokens, None, structured)
    state.admit()
    thinking = body.thinking is not None and body.thinking.type != "disabled"
    generation = Generation(state, prompt.token_ids, params, f"msg_{uuid.uuid4().hex[:24]}", tool_mode=mode,
                            tool_name=name, starts_in_reasoning=prompt.text.rstrip().endswith("<think>"),
                            reasoning_parser="think" if thinking else None,
                            session=body.metadata.user_id if body.metadata else None)
    await generation.start(request)
    if body.stream:
        return StreamingResponse(_stream(state, generation), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return JSONResponse(await cancel_on_disconnect(request, _whole(state, generation)))


def _usage(generation: Generation) -> dict:
    usage = generation.usage()
    return {"input_tokens": usage.uncached_tokens, "output_tokens": generation.completion_tokens,
            "cache_read_input_tokens": usage.cached_tokens, "cache_creation_input_tokens": usage.cache_written}


def _stop(generation: Generation, has_tool_calls: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the engine's finish."""
    if generation.finish_reason == "length":
        return "max_tokens", None
    if isinstance(generation.stop_reason, str):
        return "stop_sequence", generation.stop_reason
    return ("tool_use" if has_tool_calls else "end_turn"), None


def _message(state: GatewayState, generation: Generation, content: list[dict]) -> dict:
    return {"id": generation.request_id, "type": "message", "role": "assistant", "model": state.model_name,
            "content": content, "stop_reason": None, "stop_sequence": None, "usage": _usage(generation)}


async def _whole(state: GatewayState, generation: Generation) -> dict:
    parsed = await generation.collect()
    content: list[dict] = []
    if parsed.reasoning:
        content.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    calls = generation.tool_calls
    if parsed.content or not (calls or parsed.reasoning):
        content.append({"type": "text", "text": parsed.content})
    for call in calls:
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": call["name"],
                        "input": _arguments(call["arguments"])})
    message = _message(state, generation, content)
    message["stop_reason"], message["stop_sequence"] = _stop(generation, bool(calls))
    return message


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _stream(state: GatewayState, generation: Generation) -> AsyncIterator[str]:
    yield event({"type": "message_start", "message": _message(state, generation, [])})
    yield event({"type": "ping"})
    blocks = BlockWriter()
    try:
        async for step in generation.steps():
            for item in blocks.feed(step.delta):
                yield item
    except ENGINE_ERRORS as e:
        error = engine_api_error(e)
        state.metrics.errors.labels(state.model_name, str(error.status)).inc()
        yield "event: error\ndata: " + json.dumps(error_body(error.status, error.message)) + "\n\n"
        return
    for item in blocks.close():
        yield item
    stop_reason, stop_sequence = _stop(generation, bool(generation.tool_calls))
    yield event({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                 "usage": _usage(generation)})
    yield event({"type": "message_stop"})
