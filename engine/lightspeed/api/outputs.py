"""Request outputs: vLLM-compatible names."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """Log-probability of one token at one position (from the model's raw logits)."""

    logprob: float
    rank: int | None = None           # 1 = most likely token
    decoded_token: str | None = None


# One dict per output token: token id -> Logprob (the sampled token plus the top-n).
SampleLogprobs = list[dict[int, Logprob]]


@dataclass
class CompletionOutput:
    """One completion of a request (request.n of them)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None          # None while running; "stop", "length", "abort"
    logprobs: SampleLogprobs | None = None
    stop_reason: int | str | None = None      # the stop string or stop token id that finished it
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """What `LLM.generate` returns and `AsyncLLM.generate` yields for a request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0                 # prompt tokens served from the prefix cache
    # The same tokens by the tier they came from: {"device": .., "host": .., "disk": ..} (None: not reported).
    cached_tokens_by_tier: dict[str, int] | None = None
    metrics: dict | None = None                # arrival/first-token/finish times (seconds, time.monotonic)
