"""The FastAPI application: routes, error shapes, lifespan (engine start/stop, health monitor)."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from lightspeed_gateway import anthropic, responses
from lightspeed_gateway.config import ServerConfig
from lightspeed_gateway.openai import chat, completions
from lightspeed_gateway.openai.errors import APIError, bad_request
from lightspeed_gateway.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
)
from lightspeed_gateway.openai.serving import ClientGone, GatewayState, check_tools, encode, off_loop
from lightspeed_gateway.server.engine import EngineClient
from lightspeed_gateway.server.metrics import GatewayMetrics
from lightspeed_gateway.server.middleware import GuardMiddleware
from lightspeed_gateway.server.stats_log import StatsLogger
from lightspeed_gateway.server.supervisor import EngineSupervisor
from lightspeed_gateway.template import ChatRenderer, load_chat_template

log = logging.getLogger("lightspeed.gateway")

_ERRORS = {code: {"model": ErrorResponse, "description": text} for code, text in (
    (400, "Invalid request"), (401, "Invalid or missing API key"), (404, "Unknown model"),
    (413, "Request body too large"), (429, "Too many waiting requests (see Retry-After)"),
    (500, "The request failed inside the engine (the engine carries on)"),
    (503, "Engine not running (see Retry-After)"), (504, "The request ran past --request-timeout-s"))}
# With "stream": true the 200 body is server-sent events; each event's `data` is a JSON chunk, then [DONE].
_STREAM = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "a JSON chunk, or [DONE] at the end"},
                   "event": {"type": "string"}}}}}


# A GGUF file's name ends in its quantisation ("SmolLM2-135M-Instruct.Q4_1.gguf"); the model is the rest.
_GGUF_QUANT_SUFFIX = re.compile(r"[.\-_](?:[IT]?Q\d+(?:_[A-Z0-9]+)*|B?F(?:16|32)|MXFP4(?:_MOE)?)$", re.IGNORECASE)


def served_names(model_path: str | None, served_model_name: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The names /v1/models lists, the primary one first: --served-model-name, else the model's name
    (a folder's name; a GGUF file's stem without its quantisation)."""
    if served_model_name:
        return tuple(served_model_name)
    if not model_path:
        return ("default",)
    path = Path(model_path)
    if path.suffix == ".gguf":
        return (_GGUF_QUANT_SUFFIX.sub("", path.stem) or path.stem,)
    if path.name == "config.json":  # a dummy model from a config file: the folder names it
        return (path.parent.name or "default",)
    return (path.name,)


def accepted_names(names: tuple[str, ...], model_path: str | None) -> frozenset[str]:
    """What a request's `model` may say: a listed name, the model's path, or its file name's stem."""
    extra = {model_path, Path(model_path).stem, Path(model_path).name} if model_path else set()
    return frozenset({*names, *extra})


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def build_app(config: ServerConfig, make_engine: Callable[[], Any], model_path: str | None = None) -> FastAPI:
    """An app whose lifespan starts the engine with `make_engine()` (an AsyncLLM-like object)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        llm = make_engine()
        engine = EngineClient(llm, log_requests=config.log_requests, request_timeout_s=config.request_timeout_s)
        path = getattr(llm, "model_path", None) or model_path
        names = served_names(path, config.served_model_name)
        renderer = ChatRenderer(engine.tokenizer, load_chat_template(config.chat_template),
                                cache_tokens=config.render_cache_tokens, workers=config.render_workers,
                                answer_tokens=config.answer_cache_tokens)
        state = GatewayState(config=config, engine=engine, renderer=renderer,
                             model_name=names[0], model_names=names,
                             accepted_model_names=accepted_names(names, path), model_root=str(path or names[0]),
                             metrics=GatewayMetrics(names[0], engine.stats, lambda: renderer.answer_counts))
        app.state.gateway = state
        supervisor = EngineSupervisor(engine, config.health_check_interval_s, config.max_engine_restarts,
                                      config.engine_restart_backoff_s)
        background = [asyncio.ensure_future(supervisor.run())]
        if config.log_stats_interval_s > 0:
            background.append(asyncio.ensure_future(StatsLogger(engine).run(config.log_stats_interval_s)))
        try:
            yield
        finally:
            for task in background:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            engine.shutdown()
            state.renderer.close()

    app = FastAPI(title="Lightspeed", version=_version("lightspeed-gateway"), lifespan=lifespan,
                  description="OpenAI-compatible API of the Lightspeed inference engine.")
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_bytes=config.max_request_body_bytes,
                       error_shapes={"/v1/messages": anthropic.error_response},
                       guard_all_routes=config.api_key_scope == "all")
    _install_error_handlers(app)
    _add_routes(app)
    _add_health_route(app)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    return app


# Field names a request body may use, for "did you mean" on a misspelt one.
_REQUEST_FIELDS = sorted({name for model in (ChatCompletionRequest, CompletionRequest)
                          for name, info in model.model_fields.items()
                          for name in (name, info.alias) if name})


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """pydantic's first error as (an OpenAI-style message, the `param` it concerns)."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
        return f"The request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')}).", None
    # Union members add their type names to the location ("prompt.str"): keep only field names and indices.
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _is_type_tag(p)]
    param = ".".join(loc) or None
    message = re.sub(r"^(Value error|Assertion failed), ", "", first.get("msg", "invalid request"))
    if first.get("type") == "extra_forbidden":
        close = difflib.get_close_matches(loc[-1] if loc else "", _REQUEST_FIELDS, n=1, cutoff=0.7)
        hint = f" (did you mean {close[0]}?)" if close else ""
        return f"Unrecognized request argument supplied: {param}{hint}", param
    return (f"{param}: {message}" if param else message), param


def _is_type_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "list", "dict") or "[" in part
                                      or part.startswith(("function-", "literal")))


def _state(request: Request) -> GatewayState:
    return request.app.state.gateway


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        with contextlib.suppress(AttributeError):
            _state(request).metrics.errors.labels(_state(request).model_name, str(exc.status)).inc()
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return await api_error(request, bad_request(message, param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse({"error": {"message": str(exc.detail), "type": kind, "param": None,
                                       "code": exc.status_code}}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        log.debug("client went away before the answer: %s %s", request.method, request.url.path)
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error")
        return JSONResponse({"error": {"message": f"internal error: {type(exc).__name__}", "type": "internal_error",
                                       "param": None, "code": 500}}, status_code=500)


def _model_card(state: GatewayState, name: str) -> ModelCard:
    # `root` is the served name, never the model's path on this machine.
    return ModelCard(id=name, root=state.model_name, max_model_len=state.engine.max_model_len)


def _add_routes(app: FastAPI) -> None:
    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse,
              responses={200: {"content": _STREAM}, **_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await chat.create_chat_completion(_state(request), body, request)

    @app.post("/v1/completions", response_model=CompletionResponse, responses={200: {"content": _STREAM}, **_ERRORS})
    async def text_completions(body: CompletionRequest, request: Request):
        return await completions.create_completion(_state(request), body, request)

    @app.get("/v1/models", response_model=ModelList, responses=_ERRORS)
    async def models(request: Request):
        state = _state(request)
        return ModelList(data=[_model_card(state, name) for name in state.model_names])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_ERRORS)
    async def model(model_id: str, request: Request):
        state = _state(request)
        state.check_model(model_id)
        return _model_card(state, model_id)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_ERRORS)
    async def tokenize(body: TokenizeCompletionRequest | TokenizeChatRequest, request: Request):
        state = _state(request)
        state.check_model(body.model)
        if isinstance(body, TokenizeChatRequest):
            check_tools(state, body.tools)
            try:
                ids = (await state.renderer.render_async(body.messages, tools=body.tools,
                                                         add_generation_prompt=body.add_generation_prompt)).token_ids
            except Exception as e:
                raise bad_request(f"cannot apply the chat template: {e}", "messages") from None
        else:
            ids = await off_loop(state, encode, state.engine.tokenizer, body.prompt, body.add_special_tokens)
        return TokenizeResponse(count=len(ids), max_model_len=state.engine.max_model_len, tokens=ids)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request):
        state = _state(request)
        state.check_model(body.model)
        bad = [t for t in body.tokens if t >= state.engine.vocab_size]
        if bad:
            raise bad_request(f"token ids out of vocabulary: {bad[:5]}", "tokens")
        return DetokenizeResponse(prompt=await off_loop(state, state.engine.tokenizer.decode, body.tokens))

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}})
    async def metrics(request: Request):
        return Response(generate_latest(_state(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/version")
    async def version(request: Request) -> dict[str, str]:
        """Versions, and the device the engine runs on (benchmarks label per-GPU figures with it)."""
        info = _state(request).engine.info
        return {"version": _version("lightspeed-gateway"), "engine": _version("lightspeed"),
                "device": str(getattr(info, "device", "unknown"))}


def _add_health_route(app: FastAPI) -> None:
    @app.get("/health", response_model=HealthResponse, response_model_exclude_none=True,
             responses={200: {"description": "The engine is serving"},
                        503: {"model": HealthResponse, "description": "The engine is restarting, or dead"}})
    async def health(request: Request):
        """Status words only: why the engine is down goes to the server's log, not to clients."""
        state = _state(request)
        cores = state.engine.core_statuses()
        state.engine.check_alive()
        body: dict[str, Any] = {"status": state.engine.status}
        if cores:
            body["engines"] = cores
        if body["status"] == "ok":
            return body
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(state.config.retry_after_s)})
