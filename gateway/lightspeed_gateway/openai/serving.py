"""What the chat and completions handlers share: admission, limits, sampling params, logprobs, SSE,
tokenizer work off the event loop (the loop never encodes or decodes a prompt itself)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from lightspeed_gateway.config import ServerConfig
from lightspeed_gateway.openai.errors import (
    APIError,
    bad_request,
    engine_unavailable,
    model_not_found,
    overloaded,
)
from lightspeed_gateway.openai.protocol import SamplingFields
from lightspeed_gateway.server.engine import (
    EngineClient,
    EngineDead,
    RequestFailed,
    RequestRejected,
    RequestTimeout,
)
from lightspeed_gateway.server.metrics import GatewayMetrics
from lightspeed_gateway.template import ChatRenderer

log = logging.getLogger("lightspeed.gateway")


@dataclass
class GatewayState:
    """Everything a handler needs; built once at startup, stored on `app.state.gateway`."""

    config: ServerConfig
    engine: EngineClient
    renderer: ChatRenderer
    model_name: str                         # the primary served name: responses carry it
    model_names: tuple[str, ...]            # what /v1/models lists (model_name first)
    accepted_model_names: frozenset[str]    # what a request may name: those, the model's path, its file stem
    model_root: str                         # the model's path
    metrics: GatewayMetrics
    warned_fields: set[str] = field(default_factory=set)  # ignored request fields already logged

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.accepted_model_names:
            raise model_not_found(name)

    def admit(self, num_sequences: int = 1) -> None:
        """503 while the engine is down, 429 when too many sequences wait for their first token."""
        if self.engine.dead or not self.engine.check_alive():
            raise engine_unavailable(self.config.retry_after_s)
        waiting, limit = self.engine.num_waiting, self.config.max_waiting_requests
        # All of a request's sequences must fit (one bigger than the bound gets in when none waits).
        if waiting >= limit or (waiting and waiting + num_sequences > limit):
            raise overloaded(self.config.retry_after_s)


async def off_loop(state: GatewayState, fn: Callable[..., Any], *args: Any) -> Any:
    """Run tokenizer work in the render workers (--render-workers), off the event loop."""
    return await state.renderer.in_worker(fn, *args)


def encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


# -- limits of one request (ServerConfig, and the engine's table widths) ------------------------------
def over_limit(field_name: str, count: int, limit: int, flag: str) -> APIError:
    return bad_request(f"{field_name} has {count} entries; this server allows at most {limit} ({flag})", field_name)


def check_limits(state: GatewayState, req: SamplingFields) -> None:
    """400 naming the field and the limit for what would fan out or grow the engine's tables."""
    config, engine = state.config, state.engine
    if req.n > config.max_n:
        raise bad_request(f"n={req.n} is more than this server allows ({config.max_n}, --max-n)", "n")
    stop = [req.stop] if isinstance(req.stop, str) else req.stop or []
    if len(stop) > config.max_stop_sequences:
        raise over_limit("stop", len(stop), config.max_stop_sequences, "--max-stop-sequences")
    if len(req.stop_token_ids or ()) > engine.max_stop_token_ids:
        raise over_limit("stop_token_ids", len(req.stop_token_ids), engine.max_stop_token_ids, "--max-stop-token-ids")
    if len(req.logit_bias or {}) > engine.max_logit_bias:
        raise over_limit("logit_bias", len(req.logit_bias), engine.max_logit_bias, "--max-logit-bias")


def check_tools(state: GatewayState, tools: list | None) -> None:
    if tools and len(tools) > state.config.max_num_tools:
        raise over_limit("tools", len(tools), state.config.max_num_tools, "--max-num-tools")


def check_fan_out(state: GatewayState, num_prompts: int, n: int) -> None:
    limit = state.config.max_sequences_per_request
    if num_prompts * n > limit:
        raise bad_request(f"{num_prompts} prompts x n={n} = {num_prompts * n} sequences; this server starts at "
                          f"most {limit} per request (--max-sequences-per-request)", "n")


# The engine keeps seeds in int64 and gives choice i of a request seed + i: fold any OpenAI seed (an
# int64 or uint64) into a range where that cannot overflow. Same seed in, same seed out.
ENGINE_SEED_RANGE = 2**63 - 1024


def token_budget(state: GatewayState, prompt_len: int, requested: int | None, prompt_param: str,
                 requested_param: str = "max_tokens") -> int:
    limit = state.engine.max_model_len
    if prompt_len >= limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens; the prompt has "
                          f"{prompt_len} tokens.", prompt_param)
    if requested is None:
        return min(limit - prompt_len, state.config.max_tokens_per_request or limit)
    if prompt_len + requested > limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the "
                          f"completion). Please reduce the prompt or {requested_param}.", requested_param)
    return requested


def sampling_params(state: GatewayState, req: SamplingFields, prompt_len: int, max_tokens: int | None,
                    logprobs: int | None, structured: Any = None, prompt_param: str = "messages",
                    max_tokens_param: str = "max_tokens") -> Any:
    check_limits(state, req)
    limit = state.config.max_tokens_per_request
    if limit is not None and max_tokens is not None and max_tokens > limit:
        raise bad_request(f"{max_tokens_param}={max_tokens} is more than this server allows ({limit}, "
                          "--max-tokens-per-request)", max_tokens_param)
    budget = token_budget(state, prompt_len, max_tokens, prompt_param, max_tokens_param)
    vocab = state.engine.vocab_size
    logit_bias = None
    if req.logit_bias:
        logit_bias = {}
        for key, bias in req.logit_bias.items():
            if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab:
                raise bad_request(f"logit_bias key {key!r} is not a token id in [0, {vocab})", "logit_bias")
            logit_bias[int(key)] = bias
    for token in req.stop_token_ids or ():
        if token >= vocab:
            raise bad_request(f"stop_token_ids: {token} is not a token id in [0, {vocab})", "stop_token_ids")
    kwargs = dict(
        n=req.n, max_tokens=budget, temperature=1.0 if req.temperature is None else req.temperature,
        # top_k at or above the vocabulary keeps every token: the same as off (and a huge k must
        # never reach the core's int tensors).
        top_p=1.0 if req.top_p is None else req.top_p, top_k=0 if (req.top_k or 0) >= vocab else req.top_k or 0,
        min_p=req.min_p or 0.0, seed=None if req.seed is None else req.seed % ENGINE_SEED_RANGE, stop=req.stop, stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=logit_bias, logprobs=logprobs, min_tokens=min(req.min_tokens, budget),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
    )
    if structured is not None:
        kwargs["structured_output"] = structured
    try:
        return state.engine.make_sampling_params(**kwargs)
    except ValueError as e:
        raise bad_request(str(e)) from None


def structured_output(json_schema: dict | str | None = None, json_object: bool = False, regex: str | None = None,
                      grammar: str | None = None, param: str = "response_format") -> Any:
    from lightspeed import StructuredOutputParams

    try:
        if json_object:
            return StructuredOutputParams(json_object=True)
        if regex is not None:
            return StructuredOutputParams(regex=regex)
        if grammar is not None:
            return StructuredOutputParams(grammar=grammar)
        return StructuredOutputParams(json_schema=json_schema)
    except ValueError as e:
        raise bad_request(str(e), param) from None


def _choice_regex(choices: list[str]) -> str:
    return "(" + "|".join(re.escape(c) for c in choices) + ")"


def vllm_structured_output(req: SamplingFields) -> tuple[Any, str] | None:
    """vLLM's guided_* / structured_outputs fields as (StructuredOutputParams, the field's name), or None;
    400 when a request sets more than one."""
    given = [(name, getattr(req, name)) for name in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
             if getattr(req, name) is not None]
    if req.structured_outputs is not None:
        so = req.structured_outputs
        given += [(f"structured_outputs.{key}", value) for key, value in
                  (("json", so.json_), ("regex", so.regex), ("choice", so.choice), ("grammar", so.grammar),
                   ("json_object", so.json_object or None)) if value is not None]
    if not given:
        return None
    if len(given) > 1:
        raise bad_request(f"set one structured-output constraint, not {len(given)} ({', '.join(n for n, _ in given)})",
                          given[1][0])
    name, value = given[0]
    kind = name.rsplit(".", 1)[-1].removeprefix("guided_")
    if kind == "json":
        return structured_output(json_schema=value, param=name), name
    if kind == "json_object":
        return structured_output(json_object=True, param=name), name
    if kind == "choice":
        return structured_output(regex=_choice_regex(value), param=name), name
    if kind == "regex":
        return structured_output(regex=value, param=name), name
    return structured_output(grammar=value, param=name), name


def response_headers(state: GatewayState, req: SamplingFields) -> dict[str, str]:
    """A Warning header naming the request's ignored fields (each is also logged once per server)."""
    ignored = req.ignored_fields()
    if not ignored:
        return {}
    new = [name for name in ignored if name not in state.warned_fields]
    if new:
        state.warned_fields.update(new)
        log.warning("requests set %s, which Lightspeed accepts and ignores", ", ".join(new))
    return {"Warning": f'299 lightspeed "ignored fields without effect here: {", ".join(ignored)}"'}


def tool_grammar(tools: list[Any], tool_mode: str | None, tool_name: str | None,
                 parallel_tool_calls: bool | None) -> Any:
    """The structured output that forces tool calls: one call's arguments ("named"), or an array
    of {name, parameters} objects, at least one ("required"); None for other modes."""
    if tool_mode == "named":
        tool = next(t for t in tools if t.function.name == tool_name)
        return structured_output(json_schema=tool.function.parameters or {"type": "object"})
    if tool_mode == "required":
        items = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                    "parameters": t.function.parameters or {"type": "object"}},
                  "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
        max_items = {} if parallel_tool_calls is not False else {"maxItems": 1}
        return structured_output(json_schema={"type": "array", "minItems": 1, **max_items,
                                              "items": {"anyOf": items}})
    return None


# -- logprobs --------------------------------------------------------------------------------------
class TokenText:
    """Token id -> its text, cached (the vocabulary is finite, streaming asks for the same ids often)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -9999.0


def token_logprobs(entry: dict, token_id: int, top_n: int, token_text: TokenText) -> tuple[float, list[tuple[str, float]]]:
    """(logprob of the sampled token, top-n [(text, logprob)]) from one engine logprob dict."""
    chosen = entry.get(token_id)
    chosen_lp = _finite(_lp(chosen)) if chosen is not None else -9999.0
    ranked = sorted(entry.items(), key=lambda kv: (_rank(kv[1]), -_lp(kv[1])))
    top = [(_text(lp, tid, token_text), _finite(_lp(lp))) for tid, lp in ranked if _in_top(lp, top_n)][:top_n]
    return chosen_lp, top


def _lp(value: Any) -> float:
    return float(getattr(value, "logprob", value))


def _rank(value: Any) -> int:
    rank = getattr(value, "rank", None)
    return rank if rank is not None else 1 << 30


def _in_top(value: Any, top_n: int) -> bool:
    rank = getattr(value, "rank", None)
    return rank is None or rank <= top_n


def _text(value: Any, token_id: int, token_text: TokenText) -> str:
    decoded = getattr(value, "decoded_token", None)
    return decoded if decoded is not None else token_text(token_id)


# -- SSE and disconnects ---------------------------------------------------------------------------
def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(error: APIError) -> str:
    return sse(error.body())


class ClientGone(Exception):
    """The client disconnected before its answer: a normal event (logged at debug, no traceback)."""


async def cancel_on_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run a non-streaming handler body; if the client goes away first, cancel it (which aborts the
    request in the engine through the generator's cleanup) and raise ClientGone."""
    task = asyncio.ensure_future(work)

    async def wait_disconnect() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientGone()
    finally:
        if not task.done():  # we were cancelled ourselves: take the work down with us
            task.cancel()
        watcher.cancel()


async def merge_streams(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators as items arrive: (which stream, item)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    # Bounded: a stream that runs ahead waits for the consumer (the engine side merges its outputs).
    queue: asyncio.Queue = asyncio.Queue(maxsize=2 * len(streams))
    done_marker = object()

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
            await queue.put((i, done_marker))
        except BaseException as e:  # forwarded to the consumer
            await queue.put((i, e))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(streams)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done_marker:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_then_rest(stream: AsyncIterator[Any], request: Request | None) -> AsyncIterator[Any]:
    """Wait for a stream's first item before the response starts, so a request the engine rejects
    (or an engine that is down) still gets a proper status code instead of an error event after 200.
    With the HTTP `request`, a client that goes away during that wait cancels it."""
    iterator = stream.__aiter__()
    first_item = iterator.__anext__()
    try:
        first = await (cancel_on_disconnect(request, first_item) if request is not None else first_item)
    except StopAsyncIteration:
        first = None

    async def chained() -> AsyncIterator[Any]:
        if first is None:
            return
        yield first
        async for item in iterator:
            yield item

    return chained()


class CacheUsage:
    """Prompt tokens served from the prefix cache, over one prompt's outputs (or summed over several):
    `cached_tokens`, and the same split by KV tier, Lightspeed's `cached_tokens_by_tier` extension of
    usage.prompt_tokens_details ({"device", "host", "disk"}; absent when the engine reports none)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.by_tier: dict[str, int] | None = None

    def add(self, out: Any) -> None:
        """Take a RequestOutput's report (it comes with the first token; later outputs repeat it)."""
        tokens = out.num_cached_tokens or 0
        if tokens >= self.tokens:
            self.tokens = tokens
            self.by_tier = getattr(out, "cached_tokens_by_tier", None) or self.by_tier

    @classmethod
    def total(cls, parts: list[CacheUsage]) -> CacheUsage:
        summed = cls()
        summed.tokens = sum(p.tokens for p in parts)
        if parts and all(p.by_tier is not None for p in parts):
            summed.by_tier = {tier: sum(p.by_tier[tier] for p in parts) for tier in parts[0].by_tier}
        return summed


def usage_dict(prompt_tokens: int, completion_tokens: int, cache: CacheUsage) -> dict:
    details: dict[str, Any] = {"cached_tokens": cache.tokens}
    if cache.by_tier is not None:
        details["cached_tokens_by_tier"] = dict(cache.by_tier)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": details}


Handler = Callable[..., Awaitable[Any]]


# What the engine can fail a request with: it died (503), it refused this request (400), the request
# failed inside it (500), or the request ran out of time (504).
ENGINE_ERRORS = (EngineDead, RequestRejected, RequestFailed, RequestTimeout)


def engine_api_error(exc: Exception) -> APIError:
    """The HTTP error for an engine-side failure of one request (no engine internals in the message:
    those went to the log)."""
    if isinstance(exc, EngineDead):
        return APIError(503, "The engine stopped while serving this request; it is being restarted, retry later.",
                        "service_unavailable", code="engine_dead")
    if isinstance(exc, RequestFailed):
        return APIError(500, f"The request failed in the engine: {exc}", "internal_error", code="request_failed")
    if isinstance(exc, RequestTimeout):
        return APIError(504, f"{exc}; it was aborted (--request-timeout-s)", "timeout", code="request_timeout")
    return bad_request(str(exc))


def engine_error_events(state: GatewayState, exc: Exception) -> list[str]:
    """A stream that already sent 200 ends with an error event, then [DONE]; the error is counted."""
    error = engine_api_error(exc)
    state.metrics.errors.labels(state.model_name, str(error.status)).inc()
    return [sse_error(error), SSE_DONE]
