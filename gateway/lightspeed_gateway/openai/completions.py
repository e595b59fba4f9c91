"""POST /v1/completions: raw prompts (text or token ids, one or many), echo, logprobs."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request

from lightspeed_gateway.openai.errors import bad_request
from lightspeed_gateway.openai.protocol import CompletionRequest, new_id
from lightspeed_gateway.openai.serving import (
    ENGINE_ERRORS,
    SSE_DONE,
    CacheUsage,
    GatewayState,
    TokenText,
    cancel_on_disconnect,
    check_fan_out,
    engine_api_error,
    engine_error_events,
    first_then_rest,
    merge_streams,
    off_loop,
    over_limit,
    response_headers,
    sampling_params,
    sse,
    token_logprobs,
    usage_dict,
    vllm_structured_output,
)
from lightspeed_gateway.server.engine import RequestTiming


def _as_list(prompt: Any) -> list:
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        return [prompt]
    return list(prompt)


def _encode_all(tokenizer: Any, vocab_size: int, prompts: list) -> list[tuple[str, list[int]]]:
    """(text, token ids) per prompt; runs on the worker thread."""
    out = []
    for item in prompts:
        if isinstance(item, str):
            out.append((item, list(tokenizer.encode(item, add_special_tokens=True))))
        else:
            bad = [t for t in item if not 0 <= t < vocab_size]
            if bad:
                raise bad_request(f"prompt token ids out of vocabulary: {bad[:5]}", "prompt")
            out.append((tokenizer.decode(item), list(item)))
    if any(not ids for _, ids in out):
        raise bad_request("prompt is empty", "prompt")
    return out


async def create_completion(state: GatewayState, req: CompletionRequest, raw: Request):
    state.check_model(req.model)
    items = _as_list(req.prompt)
    if len(items) > state.config.max_num_prompts:
        raise over_limit("prompt", len(items), state.config.max_num_prompts, "--max-num-prompts")
    check_fan_out(state, len(items), req.n)
    if req.echo and req.logprobs is not None:
        raise bad_request("echo together with logprobs is not supported (no prompt logprobs)", "echo")
    prompts = await off_loop(state, _encode_all, state.engine.tokenizer, state.engine.vocab_size, items)
    structured = vllm_structured_output(req)
    params = [sampling_params(state, req, len(ids), req.max_tokens if req.max_tokens is not None else 16,
                              req.logprobs, structured[0] if structured else None, prompt_param="prompt")
              for _, ids in prompts]
    headers = response_headers(state, req)
    state.admit(len(prompts) * req.n)
    run = _CompletionRun(state, req, prompts, params)
    if req.stream:
        try:
            outputs = await first_then_rest(run.streams(), raw)
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None
        return StreamingResponse(run.stream(outputs), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
    return JSONResponse(await cancel_on_disconnect(raw, run.full()), headers=headers)


class _CompletionRun:
    def __init__(self, state: GatewayState, req: CompletionRequest, prompts: list[tuple[str, list[int]]],
                 params: list[Any]) -> None:
        self.state, self.req, self.prompts, self.params = state, req, prompts, params
        self.request_id = f"cmpl-{req.request_id}" if req.request_id else new_id("cmpl")
        self.created = int(time.time())
        self.timings = [RequestTiming() for _ in prompts]
        self.token_text = TokenText(state.engine.tokenizer) if req.logprobs is not None else None
        self.completion_tokens = [0] * len(prompts)
        self.caches = [CacheUsage() for _ in prompts]
        self.finish_reasons: list[str | None] = [None] * (len(prompts) * req.n)
        self.text_offsets = [0] * (len(prompts) * req.n)

    def streams(self):
        engine = self.state.engine
        rid = self.request_id
        session = self.req.prompt_cache_key
        return merge_streams([engine.generate(ids, p, f"{rid}-{i}" if len(self.prompts) > 1 else rid, t,
                                              self.req.priority, session)
                              for i, ((_, ids), p, t) in enumerate(zip(self.prompts, self.params, self.timings,
                                                                       strict=True))])

    def _logprobs(self, choice: int, completion: Any, echo_text: str) -> dict:
        out = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        offset = self.text_offsets[choice] + len(echo_text)
        for token_id, entry in zip(completion.token_ids, completion.logprobs or (), strict=False):
            chosen, top = token_logprobs(entry, token_id, self.req.logprobs, self.token_text)
            text = self.token_text(token_id)
            out["text_offset"].append(offset)
            out["token_logprobs"].append(chosen)
            out["tokens"].append(text)
            out["top_logprobs"].append(dict(top))
            offset += len(text)
        self.text_offsets[choice] = offset
        return out

    def _usage(self) -> dict:
        return usage_dict(sum(len(ids) for _, ids in self.prompts), sum(self.completion_tokens),
                          CacheUsage.total(self.caches))

    def _observe(self) -> None:
        n = self.req.n
        for i, ((_, ids), timing) in enumerate(zip(self.prompts, self.timings, strict=True)):
            self.state.metrics.observe_request(timing, len(ids), self.completion_tokens[i], self.caches[i].tokens,
                                               [r for r in self.finish_reasons[i * n:(i + 1) * n] if r])

    async def full(self) -> dict:
        n = self.req.n
        texts: list[list[str]] = [[] for _ in self.finish_reasons]
        logprobs: list[dict | None] = [None] * len(self.finish_reasons)
        try:
            async for which, out in self.streams():
                self.caches[which].add(out)
                for c in out.outputs:
                    choice = which * n + c.index
                    if not texts[choice] and self.req.echo:
                        texts[choice].append(self.prompts[which][0])
                    texts[choice].append(c.text)
                    self.completion_tokens[which] += len(c.token_ids)
                    if self.req.logprobs is not None:
                        piece = self._logprobs(choice, c, "")
                        if logprobs[choice] is None:
                            logprobs[choice] = piece
                        else:
                            for key, values in piece.items():
                                logprobs[choice][key] += values
                    if c.finish_reason is not None:
                        self.finish_reasons[choice] = c.finish_reason
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None
        self._observe()
        choices = [{"index": i, "text": "".join(texts[i]), "finish_reason": self.finish_reasons[i],
                    "logprobs": (logprobs[i] or {"text_offset": [], "token_logprobs": [], "tokens": [],
                                                 "top_logprobs": []}) if self.req.logprobs is not None else None}
                   for i in range(len(texts))]
        return {"id": self.request_id, "object": "text_completion", "created": self.created,
                "model": self.state.model_name, "choices": choices, "usage": self._usage()}

    def _chunk(self, choices: list[dict], usage: Any = ...) -> str:
        payload = {"id": self.request_id, "object": "text_completion", "created": self.created,
                   "model": self.state.model_name, "choices": choices}
        options = self.req.stream_options
        if usage is not ...:
            payload["usage"] = usage
        elif options is not None and options.include_usage:
            payload["usage"] = self._usage() if options.continuous_usage_stats else None
        return sse(payload)

    async def stream(self, outputs: AsyncIterator[tuple[int, Any]]) -> AsyncIterator[str]:
        n = self.req.n
        echoed = [False] * len(self.finish_reasons)
        try:
            async for which, out in outputs:
                self.caches[which].add(out)
                choices = []
                for c in out.outputs:
                    choice = which * n + c.index
                    text = c.text
                    if self.req.echo and not echoed[choice]:
                        echoed[choice] = True
                        text = self.prompts[which][0] + text
                    self.completion_tokens[which] += len(c.token_ids)
                    if c.finish_reason is not None:
                        self.finish_reasons[choice] = c.finish_reason
                    if not text and c.finish_reason is None and self.req.logprobs is None:
                        continue
                    choices.append({"index": choice, "text": text, "finish_reason": c.finish_reason,
                                    "logprobs": self._logprobs(choice, c, "") if self.req.logprobs is not None
                                    else None})
                if choices:
                    yield self._chunk(choices)
            options = self.req.stream_options
            if options is not None and options.include_usage:
                yield self._chunk([], self._usage())
            self._observe()
            yield SSE_DONE
        except ENGINE_ERRORS as e:
            for event in engine_error_events(self.state, e):
                yield event
