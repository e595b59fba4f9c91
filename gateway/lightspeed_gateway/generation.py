"""One single-choice generation through the engine and the output parsers, for the agents' APIs.

The Anthropic Messages and OpenAI Responses handlers differ in wire shapes only: both render a
conversation with the shared `ChatRenderer`, build SamplingParams, then consume the same stream of
parsed steps (content, reasoning and tool-call pieces, then the finish). This module is that
shared middle; chat completions keeps its n-way, logprob-carrying loop in `openai/chat.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from lightspeed_gateway.openai.chat import ChoiceParser, remember_plain_answer
from lightspeed_gateway.openai.serving import (
    ENGINE_ERRORS,
    CacheUsage,
    GatewayState,
    engine_api_error,
    first_then_rest,
)
from lightspeed_gateway.parsers import REASONING_PARSERS, ParsedDelta
from lightspeed_gateway.server.engine import RequestTiming


@dataclass
class Step:
    """What one engine output added, parsed."""

    delta: ParsedDelta
    finish_reason: str | None = None    # the engine's: "stop" | "length" | "abort" (last step only)
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it


@dataclass(frozen=True)
class PromptUsage:
    """How the prompt's tokens were served: from the prefix cache, newly cached, or neither."""

    prompt_tokens: int
    cached_tokens: int      # prefix-cache hits (read)
    cache_written: int      # full pages of the prompt the engine newly cached (written)
    cached_tokens_by_tier: dict[str, int] | None = None  # cached_tokens by KV tier: device, host, disk

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - self.cache_written


class Generation:
    """One request in flight: `start()` (engine rejections surface as status codes), then `steps()`."""

    def __init__(self, state: GatewayState, prompt_ids: list[int], params: Any, request_id: str, *,
                 tool_mode: str | None = None, tool_name: str | None = None, starts_in_reasoning: bool = False,
                 reasoning_parser: str | None = None, session: str | None = None) -> None:
        self.state, self.prompt_ids, self.params, self.request_id = state, prompt_ids, params, request_id
        self.session = session  # the conversation's id: a retention hint for its cached prefix
        self.timing = RequestTiming()
        self.parser = ChoiceParser(state, tool_mode, tool_name, starts_in_reasoning)
        if self.parser.reasoning is None and reasoning_parser is not None:
            self.parser.reasoning = REASONING_PARSERS[reasoning_parser](starts_in_reasoning)
        self.completion_tokens = 0
        self.token_ids: list[int] = []  # generated
        self.cache = CacheUsage()
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self._outputs: AsyncIterator[Any] | None = None

    @property
    def tool_calls(self) -> list[dict]:
        """Complete, valid calls so far: [{id, name, arguments}]."""
        return self.parser.tool_calls

    def usage(self) -> PromptUsage:
        prompt = len(self.prompt_ids)
        written = 0
        if self.state.engine.prefix_cache:
            page = self.state.engine.page_size
            # The engine caches every full page it computes; the last prompt token is always computed.
            written = max(0, (prompt // page) * page - self.cache.tokens)
        return PromptUsage(prompt, self.cache.tokens, written, self.cache.by_tier)

    async def start(self, raw: Request | None) -> None:
        """Wait for the first output. `raw`: the HTTP request whose disconnect cancels the wait
        (None for background work, which has no client to lose)."""
        outputs = self.state.engine.generate(self.prompt_ids, self.params, self.request_id, self.timing,
                                             session=self.session)
        try:
            self._outputs = await first_then_rest(outputs, raw)
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None

    async def steps(self) -> AsyncIterator[Step]:
        """Parsed steps until the engine finishes; raises EngineDead / RequestRejected mid-stream."""
        assert self._outputs is not None, "start() first"
        async for out in self._outputs:
            self.cache.add(out)
            for completion in out.outputs:
                self.completion_tokens += len(completion.token_ids)
                self.token_ids += completion.token_ids
                delta = self.parser.feed(completion.text) if completion.text else ParsedDelta()
                if completion.finish_reason is not None:
                    tail = self.parser.finish()
                    delta.content += tail.content
                    delta.reasoning += tail.reasoning
                    delta.tool_calls += tail.tool_calls
                    self.finish_reason, self.stop_reason = completion.finish_reason, completion.stop_reason
                    yield Step(delta, completion.finish_reason, completion.stop_reason)
                elif delta:
                    yield Step(delta)
        remember_plain_answer(self.state, self.parser, self.finish_reason, self.token_ids)
        self.state.metrics.observe_request(self.timing, len(self.prompt_ids), self.completion_tokens,
                                           self.cache.tokens, [self.finish_reason or "abort"])

    async def collect(self) -> ParsedDelta:
        """Run to the end; the whole output (engine failures raise the HTTP error)."""
        whole = ParsedDelta()
        try:
            async for step in self.steps():
                whole.content += step.delta.content
                whole.reasoning += step.delta.reasoning
        except ENGINE_ERRORS as e:
            raise engine_api_error(e) from None
        return whole
