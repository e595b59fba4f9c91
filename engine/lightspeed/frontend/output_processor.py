"""Client-side request state: tokens -> text, stop strings, n-way groups -> RequestOutput.

Design: the engine's per-step messages only update state and set the group's event; the consumer
(`AsyncLLM.generate`) builds a RequestOutput when it wakes. A slow consumer therefore sees
coalesced updates instead of a growing queue of snapshots, and cumulative outputs cost one copy per
yield, not per step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..api.outputs import CompletionOutput, Logprob, RequestOutput
from ..api.sampling_params import RequestOutputKind, SamplingParams
from ..core import messages as m
from .detokenizer import IncrementalDetokenizer, StopStringChecker


class SequenceState:
    """One completion (one engine request) of a group."""

    def __init__(self, engine_id: str, index: int, params: SamplingParams, tokenizer: Any, prompt_ids: list[int]):
        self.engine_id, self.index, self.params = engine_id, index, params
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.detok = (IncrementalDetokenizer(tokenizer, prompt_ids, params.skip_special_tokens)
                      if tokenizer is not None and params.detokenize else None)
        self.stops = StopStringChecker(params.stop, params.include_stop_str_in_output)
        self._tokenizer = tokenizer
        self.sent_tokens = 0   # delta mode: what the consumer has seen
        self.sent_chars = 0

    def append(self, token: int, logprobs: m.TokenLogprobs | None, new_text: str | None = None) -> bool:
        """Add one token and the text it completed (`new_text`, from the step's batch decode; None
        decodes here). True when a stop string finished the sequence (the core must abort it)."""
        self.token_ids.append(token)
        if logprobs is not None and self.logprobs is not None:
            self._add_logprobs(token, logprobs)
        if self.detok is None:
            return False
        if new_text is None:
            new_text = self.detok.step([token])
        self.text += new_text
        hit = self.stops.check(self.text, len(new_text))
        if hit is not None:
            self.text, self.stop_reason = hit
            self.finish_reason = "stop"
            return True
        return False

    def _add_logprobs(self, token: int, lp: m.TokenLogprobs) -> None:
        decode = (lambda t: self._tokenizer.decode([t])) if self._tokenizer is not None else (lambda t: None)
        entry = {token: Logprob(lp.logprob, lp.rank, decode(token))}
        for rank, (tid, val) in enumerate(zip(lp.top_ids, lp.top_logprobs, strict=True), start=1):
            if tid not in entry:
                entry[tid] = Logprob(val, rank, decode(tid))
        self.logprobs.append(entry)
        self.cumulative_logprob += lp.logprob

    def finish(self, reason: str) -> None:
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        if reason == "stop" and self.token_ids and self.token_ids[-1] in self.params.stop_token_ids:
            self.stop_reason = self.token_ids[-1]

    def output(self, kind: RequestOutputKind) -> CompletionOutput:
        finished = self.finish_reason is not None
        visible = self.stops.safe_len(self.text, finished)
        if kind is RequestOutputKind.DELTA:
            start_tok, start_chr = self.sent_tokens, min(self.sent_chars, visible)
            self.sent_tokens, self.sent_chars = len(self.token_ids), visible
            return CompletionOutput(self.index, self.text[start_chr:visible], self.token_ids[start_tok:],
                                    self.finish_reason, self.logprobs[start_tok:] if self.logprobs is not None else None,
                                    self.stop_reason, self.cumulative_logprob)
        return CompletionOutput(self.index, self.text[:visible], list(self.token_ids), self.finish_reason,
                                list(self.logprobs) if self.logprobs is not None else None, self.stop_reason,
                                self.cumulative_logprob)


class RequestGroup:
    """The n completions of one user request, and the event its consumer waits on."""

    def __init__(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams,
                 seqs: list[SequenceState]):
        self.request_id, self.prompt, self.prompt_ids, self.params = request_id, prompt, prompt_ids, params
        self.seqs = seqs
        self.num_cached_tokens = 0
        self.cached_tokens_by_tier: dict[str, int] | None = None
        self.error: BaseException | None = None
        self.event = asyncio.Event()
        self._changed: set[int] = set()
        self.delivered_final = False

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)

    def note_cached(self, num_cached: int, by_tier: list[int] | None) -> None:
        """A completion's prefix-cache hit; the group reports its largest (the n completions share a prompt)."""
        if num_cached < self.num_cached_tokens or (num_cached == self.num_cached_tokens and self.cached_tokens_by_tier):
            return
        self.num_cached_tokens = num_cached
        if by_tier is not None:
            self.cached_tokens_by_tier = dict(zip(("device", "host", "disk"), by_tier, strict=True))

    def touch(self, index: int) -> None:
        self._changed.add(index)
        self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()

    def build_output(self) -> RequestOutput | None:
        """The output to yield now, or None when there is nothing new for this output kind."""
        kind, finished = self.params.output_kind, self.finished
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        if kind is RequestOutputKind.DELTA:
            outputs = [s.output(kind) for s in self.seqs if s.index in self._changed]
        else:
            outputs = [s.output(RequestOutputKind.CUMULATIVE) for s in self.seqs]
        self._changed.clear()
        return RequestOutput(self.request_id, self.prompt, self.prompt_ids, outputs, finished, self.num_cached_tokens,
                             cached_tokens_by_tier=self.cached_tokens_by_tier)
