"""SpeculativeConfig: how the engine drafts tokens, as vLLM's `--speculative-config` spells it.

    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4}'
    LLM(speculative_config={"method": "eagle3", "model": "/path/to/eagle3-head", "num_speculative_tokens": 3})

Methods: "ngram" (prompt lookup over the request's own tokens, on the host), "ngram_gpu" (the same
lookup on the device, so steps keep overlapping), "suffix" (also the outputs of recent requests of
the same conversation), "mtp" (DeepSeek-V3 / Kimi-K2's multi-token-prediction
module of the served checkpoint), "eagle3" (an EAGLE-3 head for a Llama-3 model, from a Hugging
Face folder). Bad values raise ValueError naming the key, at start-up.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "ngram_gpu", "suffix", "mtp", "eagle3")
# The attention kernels take at most 16 query tokens per request: the input plus 15 drafts.
MAX_SPECULATIVE_TOKENS = 15


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings (field names as vLLM's speculative config)."""

    method: str
    num_speculative_tokens: int
    model: str | None = None                        # eagle3: the head's folder; mtp: default the served model
    prompt_lookup_min: int = 3                      # ngram, ngram_gpu: shortest tail match that drafts
    prompt_lookup_max: int = 8                      # ngram, ngram_gpu: longest tail compared
    suffix_decoding_max_tree_depth: int = 24        # suffix: longest tail compared
    suffix_decoding_max_cached_requests: int = 1000  # suffix: finished requests kept for matching
    suffix_decoding_max_spec_factor: float = 1.0    # suffix: drafts <= factor * match length
    suffix_decoding_min_token_prob: float = 0.1     # suffix: least agreement among matching places

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative_config: unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an integer in "
                             f"1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        for name in ("prompt_lookup_min", "prompt_lookup_max", "suffix_decoding_max_tree_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"speculative_config: {name} must be a positive integer, got {value!r}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(f"speculative_config: prompt_lookup_max ({self.prompt_lookup_max}) is below "
                             f"prompt_lookup_min ({self.prompt_lookup_min})")
        if self.suffix_decoding_max_cached_requests < 0:
            raise ValueError("speculative_config: suffix_decoding_max_cached_requests must be >= 0")
        if not self.suffix_decoding_max_spec_factor > 0:
            raise ValueError("speculative_config: suffix_decoding_max_spec_factor must be > 0")
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise ValueError("speculative_config: suffix_decoding_min_token_prob must be in [0, 1]")
        if self.method == "eagle3" and not self.model:
            raise ValueError('speculative_config: method "eagle3" needs "model": the EAGLE-3 head\'s folder')

    @property
    def on_device(self) -> bool:
        """Drafts are made on the device right after verification (mtp, eagle3, ngram_gpu), not
        by the host from collected tokens: such steps can overlap."""
        return self.method in ("mtp", "eagle3", "ngram_gpu")

    @property
    def draft_model(self) -> bool:
        """Drafts come from a model (mtp, eagle3): it caches into one more KV layer and reads the
        target's hidden states."""
        return self.method in ("mtp", "eagle3")

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | str | None) -> SpeculativeConfig | None:
        """From a JSON string (the CLI), a dict (Python, or the config's JSON form) or an instance."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            if not value.strip() or value.strip().lower() in ("none", "null"):
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        for required in ("method", "num_speculative_tokens"):
            if required not in value:
                raise ValueError(f"speculative_config needs {required!r}")
        return cls(**value)
