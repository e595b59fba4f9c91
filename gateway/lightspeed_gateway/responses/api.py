"""POST /v1/responses, GET / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel.

A request's conversation is the chain of stored responses named by `previous_response_id` (their
inputs and outputs, in order) plus its own input; `instructions` apply to this request only, as
in OpenAI's API. The conversation renders through the shared incremental renderer, so turn k+1's
tokens extend turn k's and the engine's prefix cache serves them. `background=true` runs the
request as a task: the reply is the queued response, GET polls it, cancel aborts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from lightspeed_gateway.generation import Generation
from lightspeed_gateway.openai.errors import APIError, bad_request
from lightspeed_gateway.openai.protocol import ErrorResponse, SamplingFields
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
from lightspeed_gateway.responses.convert import normalise_items, output_items_as_input, to_chat, tools_of
from lightspeed_gateway.responses.output import OutputBuilder
from lightspeed_gateway.responses.protocol import NamedToolChoice, ResponsesRequest
from lightspeed_gateway.responses.store import MemoryStore, SqliteStore, StoredResponse, open_store


@dataclass
class ResponsesState:
    store: MemoryStore | SqliteStore
    background: dict[str, asyncio.Task] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    config = app.state.gateway.config
    state = ResponsesState(open_store(config.responses_store_path, config.responses_store_size))
    app.state.responses = state
    try:
        yield
    finally:
        for task in list(state.background.values()):
            task.cancel()
        await asyncio.gather(*state.background.values(), return_exceptions=True)
        state.store.close()


_ERRORS = {code: {"model": ErrorResponse, "description": text} for code, text in (
    (400, "Invalid request"), (401, "Invalid or missing API key"), (404, "Unknown model or response"),
    (413, "Request body too large"), (429, "Too many waiting requests (see Retry-After)"),
    (503, "Engine not running (see Retry-After)"))}
_STREAM = {200: {"content": {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON event"}, "event": {"type": "string"}}}}},
                 "description": "A Response, or with stream=true the Responses server-sent events"}}
router = APIRouter(tags=["responses"], lifespan=lifespan, responses=_ERRORS)


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", None, "not_found")


async def conversation(store, previous_id: str) -> list[dict]:
    """The items of the chain ending at `previous_id`, oldest first (inputs, then outputs)."""
    chain: list[StoredResponse] = []
    response_id: str | None = previous_id
    while response_id is not None:
        stored = await store.get(response_id)
        if stored is None:
            what = "" if response_id == previous_id else f" (its earlier response '{response_id}' is no longer stored)"
            raise APIError(400, f"Previous response with id '{previous_id}' not found{what}.", "invalid_request_error",
                           "previous_response_id", "previous_response_not_found")
        if stored.response["status"] in ("queued", "in_progress"):
            raise bad_request(f"Previous response '{response_id}' is still {stored.response['status']}.",
                              "previous_response_id")
        chain.append(stored)
        response_id = stored.previous_response_id
    items: list[dict] = []
    for stored in reversed(chain):
        items += stored.input_items + output_items_as_input(stored.response["output"])
    return items


def _tool_mode(req: ResponsesRequest) -> tuple[str | None, str | None]:
    if not req.tools or req.tool_choice == "none":
        return None, None
    if isinstance(req.tool_choice, NamedToolChoice):
        return "named", req.tool_choice.name
    return ("required", None) if req.tool_choice == "required" else ("auto", None)


def _structured(req: ResponsesRequest, tools, mode: str | None, name: str | None):
    forced = tool_grammar(tools, mode, name, req.parallel_tool_calls) if tools else None
    fmt = req.text.format if req.text is not None else None
    if forced is not None or fmt is None or fmt.type == "text":
        return forced
    if fmt.type == "json_object":
        return structured_output(json_object=True)
    return structured_output(json_schema=fmt.schema_)


@router.post("/v1/responses", responses=_STREAM)
async def create_response(body: ResponsesRequest, request: Request):
    state: GatewayState = request.app.state.gateway
    responses: ResponsesState = request.app.state.responses
    state.check_model(body.model)
    check_tools(state, body.tools)
    items = normalise_items(body.input)
    history = await conversation(responses.store, body.previous_response_id) if body.previous_response_id else []
    messages, tools = to_chat(history + items, body.instructions), tools_of(body.tools)
    thinking = body.reasoning is not None and body.reasoning.effort not in (None, "none")
    try:
        prompt = await state.renderer.render_async(messages, tools=tools, template_kwargs=(
            {"enable_thinking": thinking} if body.reasoning is not None else None))
    except APIError:
        raise
    except Exception as e:  # jinja errors, message orders the template refuses: the client's input
        raise bad_request(f"cannot apply the chat template: {e}", "input") from None
    mode, name = _tool_mode(body)
    params = sampling_params(state, SamplingFields(temperature=body.temperature, top_p=body.top_p),
                             len(prompt.token_ids), body.max_output_tokens, None, _structured(body, tools, mode, name))
    state.admit()
    run = _Run(state, responses, body, items, Generation(
        state, prompt.token_ids, params, f"resp_{uuid.uuid4().hex}", tool_mode=mode, tool_name=name,
        starts_in_reasoning=prompt.text.rstrip().endswith("<think>"), reasoning_parser="think" if thinking else None,
        session=body.prompt_cache_key))
    if body.background:
        return JSONResponse(await run.start_background())
    await run.generation.start(request)
    if body.stream:
        return StreamingResponse(run.stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return JSONResponse(await cancel_on_disconnect(request, run.whole()))


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request):
    stored = await request.app.state.responses.store.get(response_id)
    if stored is None:
        raise not_found(response_id)
    return JSONResponse(stored.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request):
    responses: ResponsesState = request.app.state.responses
    task = responses.background.get(response_id)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if not await responses.store.delete(response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request):
    responses: ResponsesState = request.app.state.responses
    stored = await responses.store.get(response_id)
    if stored is None:
        raise not_found(response_id)
    if not stored.response.get("background"):
        raise bad_request("Only responses created with background=true can be cancelled.", None)
    task = responses.background.get(response_id)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        stored = await responses.store.get(response_id) or stored
    return JSONResponse(stored.response)


class _Run:
    """One response being produced."""

    def __init__(self, state: GatewayState, responses: ResponsesState, req: ResponsesRequest, items: list[dict],
                 generation: Generation) -> None:
        self.state, self.responses, self.req, self.items, self.generation = state, responses, req, items, generation
        self.id = generation.request_id
        self.created_at = int(time.time())
        self.output = OutputBuilder()
        self.usage: dict | None = None

    def response(self, status: str, error: dict | None = None) -> dict:
        req = self.req
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": req.background, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": self.state.model_name, "output": self.output.items,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning.model_dump() if req.reasoning else {"effort": None, "summary": None},
            "store": req.store, "temperature": req.temperature, "top_p": req.top_p,
            "text": {"format": req.text.format.model_dump(by_alias=True, exclude_none=True)
                     if req.text and req.text.format else {"type": "text"}},
            "tool_choice": req.tool_choice.model_dump() if isinstance(req.tool_choice, NamedToolChoice)
            else (req.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()], "truncation": req.truncation or "disabled",
            "usage": self.usage, "metadata": req.metadata or {}, "user": req.user,
            "prompt_cache_key": req.prompt_cache_key,
        }

    async def _finish(self) -> dict:
        """Close the output, count usage, store; the final response."""
        incomplete = self.generation.finish_reason == "length"
        self.output.ensure_output()
        self.output.close("incomplete" if incomplete else "completed")
        usage = self.generation.usage()
        reasoning = [p["text"] for item in self.output.items if item["type"] == "reasoning" for p in item["content"]]
        reasoning_tokens = sum(map(len, await self.state.renderer.encode_async(reasoning))) if reasoning else 0
        details = {"cached_tokens": usage.cached_tokens, "cache_write_tokens": usage.cache_written}
        if usage.cached_tokens_by_tier is not None:  # Lightspeed's extension, as in chat completions
            details["cached_tokens_by_tier"] = dict(usage.cached_tokens_by_tier)
        self.usage = {"input_tokens": usage.prompt_tokens, "input_tokens_details": details,
                      "output_tokens": self.generation.completion_tokens,
                      "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                      "total_tokens": usage.prompt_tokens + self.generation.completion_tokens}
        final = self.response("incomplete" if incomplete else "completed")
        await self._store(final)
        return final

    async def _store(self, response: dict) -> None:
        if self.req.store:
            await self.responses.store.put(self.id, StoredResponse(response, self.items, self.req.previous_response_id))

    async def whole(self) -> dict:
        try:
            async for step in self.generation.steps():
                self.output.feed(step.delta)
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None
        return await self._finish()

    async def stream(self) -> AsyncIterator[str]:
        out = self.output
        yield out.event("response.created", response=self.response("in_progress"))
        yield out.event("response.in_progress", response=self.response("in_progress"))
        try:
            async for step in self.generation.steps():
                for item in out.feed(step.delta):
                    yield item
        except ENGINE_ERRORS as e:
            error = engine_api_error(e)
            self.state.metrics.errors.labels(self.state.model_name, str(error.status)).inc()
            yield out.event("error", code=error.code, message=error.message, param=None)
            failed = self.response("failed", {"code": "server_error", "message": error.message})
            await self._store(failed)
            yield out.event("response.failed", response=failed)
            return
        incomplete = self.generation.finish_reason == "length"
        for item in [*out.ensure_output(), *out.close("incomplete" if incomplete else "completed")]:
            yield item
        final = await self._finish()
        yield out.event("response.incomplete" if incomplete else "response.completed", response=final)

    async def start_background(self) -> dict:
        queued = self.response("queued")
        await self._store(queued)
        task = asyncio.ensure_future(self._background())
        self.responses.background[self.id] = task
        task.add_done_callback(lambda _: self.responses.background.pop(self.id, None))
        return queued

    async def _background(self) -> None:
        try:
            await self.generation.start(None)
            await self._store(self.response("in_progress"))
            await self.whole()
        except asyncio.CancelledError:
            self.output.close("incomplete")
            await self._store(self.response("cancelled"))
        except APIError as e:
            await self._store(self.response("failed", {"code": "server_error" if e.status >= 500 else
                                                       "invalid_request", "message": e.message}))
