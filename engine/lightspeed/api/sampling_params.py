"""SamplingParams: vLLM-compatible names, validated at construction."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any


class RequestOutputKind(enum.Enum):
    """What `AsyncLLM.generate` yields for a request."""

    CUMULATIVE = 0  # every output carries all text/tokens so far (default, as in vLLM)
    DELTA = 1       # every output carries only what is new since the previous one
    FINAL_ONLY = 2  # one output, when the request finishes


@dataclass
class StructuredOutputParams:
    """Constrain the output with a grammar (xgrammar). Set exactly one field."""

    json_schema: str | dict | None = None  # a JSON schema (dict or JSON text)
    json_object: bool = False              # any JSON object
    regex: str | None = None               # a regular expression
    grammar: str | None = None             # an EBNF grammar (GBNF dialect)

    def __post_init__(self) -> None:
        chosen = [self.json_schema is not None, bool(self.json_object), self.regex is not None,
                  self.grammar is not None]
        if sum(chosen) != 1:
            raise ValueError("StructuredOutputParams needs exactly one of json_schema, json_object, regex, grammar")
        if isinstance(self.json_schema, dict):
            self.json_schema = json.dumps(self.json_schema)
        if self.json_schema is not None:
            try:
                json.loads(self.json_schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None

    def kind_and_spec(self) -> tuple[str, str]:
        if self.json_schema is not None:
            return "json_schema", self.json_schema
        if self.json_object:
            return "json_object", ""
        if self.regex is not None:
            return "regex", self.regex
        return "grammar", self.grammar or ""


@dataclass
class SamplingParams:
    """How to sample one request. Names and meanings follow vLLM's SamplingParams."""

    n: int = 1                                  # completions per prompt (share the prompt's KV via the prefix cache)
    max_tokens: int | None = 16                 # most new tokens; None = up to max_model_len
    min_tokens: int = 0                         # EOS / stop tokens are masked until this many tokens exist
    temperature: float = 1.0                    # 0 = greedy
    top_p: float = 1.0                          # nucleus mass in (0, 1]; 1 = off
    top_k: int = 0                              # keep the k most likely; 0 or -1 = off
    min_p: float = 0.0                          # drop tokens below min_p x p(max); 0 = off
    seed: int | None = None                     # per-request seed (reproducible sampling)
    stop: str | list[str] | None = None         # stop strings (checked on the detokenised text)
    stop_token_ids: list[int] | None = None     # extra token ids that finish the request
    ignore_eos: bool = False                    # keep going past EOS
    presence_penalty: float = 0.0               # in [-2, 2]
    frequency_penalty: float = 0.0              # in [-2, 2]
    repetition_penalty: float = 1.0             # > 0; 1 = off
    logit_bias: dict[int, float] | None = None  # token id -> bias added to its logit, in [-100, 100]
    logprobs: int | None = None                 # top-n logprobs per output token (sampled token always included)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    structured_output: StructuredOutputParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    detokenize: bool = True
    extra_args: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        if self.logit_bias:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if isinstance(self.structured_output, dict):
            self.structured_output = StructuredOutputParams(**self.structured_output)
        self._validate()

    def _validate(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(msg)

        if not isinstance(self.n, int) or self.n < 1:
            bad(f"n must be at least 1, got {self.n}")
        if self.max_tokens is not None and self.max_tokens < 1:
            bad(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            bad(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if not self.temperature >= 0.0:
            bad(f"temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or not -1 <= self.top_k < 2**31:
            bad(f"top_k must be -1 (disable), 0 (disable) or in [1, 2**31), got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            bad(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not self.repetition_penalty > 0.0:
            bad(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")
        if self.logprobs is not None and self.logprobs < 0:
            bad(f"logprobs must be non-negative, got {self.logprobs}")
        # Seeds live in an int64 tensor on the device; n > 1 uses seed + i for choice i.
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed <= 2**63 - 1 - self.n):
            bad(f"seed must be an integer in [0, 2**63 - 1 - n], got {self.seed!r}")
        if any(not s for s in self.stop):
            bad("stop strings must be non-empty")
        if any(t < 0 for t in self.stop_token_ids):
            bad(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
        for token, bias in (self.logit_bias or {}).items():
            if token < 0:
                bad(f"logit_bias token ids must be non-negative, got {token}")
            if not -100.0 <= bias <= 100.0:
                bad(f"logit_bias values must be in [-100, 100], got {bias} for token {token}")
        if not isinstance(self.output_kind, RequestOutputKind):
            bad(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
