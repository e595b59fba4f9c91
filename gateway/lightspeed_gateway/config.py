"""ServerConfig: the gateway's own knobs (HTTP, auth, parsers, limits), a frozen dataclass.

A field's ``metadata["help"]`` is its `lightspeed serve` flag help; the engine's flags come from
`lightspeed.EngineConfig` the same way (see `cli/args.py`), so no flag is written twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lightspeed_gateway.parsers import REASONING_PARSERS, TOOL_PARSERS

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
API_KEY_SCOPES = ("v1", "all")


def _f(default: Any, help: str, choices: tuple | None = None) -> Any:
    meta: dict[str, Any] = {"help": help}
    if choices is not None:
        meta["choices"] = choices
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ServerConfig:
    """The HTTP server's knobs (a frozen dataclass, checked in __post_init__)."""

    host: str = _f("127.0.0.1", "Address to listen on (0.0.0.0 exposes the server to the network).")
    port: int = _f(8000, "TCP port to listen on (0 picks a free one).")
    api_key: str | None = _f(None, "API key clients must send as 'Authorization: Bearer KEY' on /v1 routes "
                             "(default: env LIGHTSPEED_API_KEY; none = no auth).")
    served_model_name: tuple[str, ...] = _f((), "Names clients may send as `model` (several allowed, as in "
                                            "vLLM; the first is the one responses carry). Default: the model's "
                                            "name, e.g. SmolLM2-135M-Instruct for SmolLM2-135M-Instruct.Q4_1.gguf.")
    chat_template: str | None = _f(None, "Jinja chat template (a file path or the template text); default: "
                                   "the tokenizer's.")
    render_cache_tokens: int = _f(4_000_000, "Token ids of rendered conversations the chat renderer remembers, so "
                                  "a turn tokenises only its new messages (0 = off).")
    answer_cache_tokens: int = _f(2_000_000, "Token ids of generated answers remembered, so that an answer sent back "
                                  "as the next turn's assistant message keeps the ids it was generated as and the "
                                  "prefix cache matches through it (re-tokenising its text can give other ids); "
                                  "0 = off: every message is tokenised from its text.")
    render_workers: int = _f(1, "Worker threads that render chat templates and tokenise prompts off the event "
                             "loop (template rendering holds the GIL: more threads add event-loop lag, not speed).")
    responses_store_size: int = _f(4096, "Responses kept for previous_response_id and GET /v1/responses/{id} "
                                   "(least recently used beyond are dropped).")
    responses_store_path: str | None = _f(None, "SQLite file for stored responses (default: in memory, lost at "
                                          "exit).")
    tool_call_parser: str = _f("hermes", "How tool calls are read from the model's output.", tuple(TOOL_PARSERS))
    reasoning_parser: str | None = _f(None, "Split <think>...</think> reasoning into reasoning_content.",
                                      tuple(REASONING_PARSERS))
    log_level: str = _f("info", "Log level of the server.", LOG_LEVELS)
    max_request_body_bytes: int = _f(16 * 1024 * 1024, "Largest accepted request body in bytes (413 above).")
    max_waiting_requests: int = _f(1024, "Sequences (prompts x n) that may wait for their first token at once; "
                                   "more get 429 with Retry-After.")
    retry_after_s: int = _f(1, "Retry-After seconds sent with 429 and 503 answers.")
    health_check_interval_s: float = _f(0.25, "How often the server checks that the engine core is alive.")
    access_log: bool = _f(False, "Log every HTTP request (uvicorn access log).")
    log_requests: bool = _f(False, "Log one line when a request arrives (prompt tokens, sampling) and one when "
                            "it finishes (tokens, time to first token, speed).")
    log_stats_interval_s: float = _f(10.0, "Seconds between the engine stats lines (prompt and generation "
                                     "tokens/s, running and waiting requests, KV-cache use, prefix-cache hit "
                                     "rate, prefills in progress) while the engine is busy; 0 turns them off.")
    api_key_scope: str = _f("v1", "Routes the API key guards: v1 (the /v1 API, as vLLM) or all (also /tokenize, "
                            "/detokenize, /metrics, /version and the docs; /health stays open).", API_KEY_SCOPES)
    # Limits of one request: over a limit is a 400 naming it (the engine's own, logit_bias and
    # stop_token_ids, are --max-logit-bias and --max-stop-token-ids).
    max_num_prompts: int = _f(64, "Most prompts in one /v1/completions request.")
    max_n: int = _f(128, "Largest n (choices per prompt).")
    max_sequences_per_request: int = _f(256, "Most sequences (prompts x n) one request may start.")
    max_stop_sequences: int = _f(16, "Most stop strings per request.")
    max_num_tools: int = _f(128, "Most tools per chat request.")
    max_tokens_per_request: int | None = _f(None, "Largest max_tokens a request may ask for (a request that sets "
                                            "none gets at most this); default: up to --max-model-len.")
    request_timeout_s: float = _f(600.0, "Seconds a request may take from arrival to its last token; then it is "
                                  "aborted and answered 504 (or, when streaming, an error event).")
    max_engine_restarts: int = _f(5, "Restarts of a dead engine core in a row before the server gives up "
                                  "(/health then says dead); an engine that stays up 60 s resets the count.")
    engine_restart_backoff_s: float = _f(1.0, "Wait before the second restart in a row; doubles with each one "
                                         "after (the first restart is immediate).")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(f"tool_call_parser={self.tool_call_parser!r}: choose from {sorted(TOOL_PARSERS)}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser={self.reasoning_parser!r}: choose from {sorted(REASONING_PARSERS)}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level={self.log_level!r}: choose from {LOG_LEVELS}")
        if self.render_cache_tokens < 0 or self.answer_cache_tokens < 0 or self.render_workers < 1:
            raise ValueError("render_cache_tokens and answer_cache_tokens must be >= 0 and render_workers >= 1")
        if self.responses_store_size < 1:
            raise ValueError("responses_store_size must be >= 1")
        if self.max_request_body_bytes < 1:
            raise ValueError("max_request_body_bytes must be positive")
        if self.max_waiting_requests < 0:
            raise ValueError("max_waiting_requests must be >= 0")
        if self.retry_after_s < 0 or self.health_check_interval_s <= 0:
            raise ValueError("retry_after_s must be >= 0 and health_check_interval_s > 0")
        if self.log_stats_interval_s < 0:
            raise ValueError("log_stats_interval_s must be >= 0")
        if isinstance(self.served_model_name, str):  # one name given as a string
            object.__setattr__(self, "served_model_name", (self.served_model_name,))
        object.__setattr__(self, "served_model_name", tuple(self.served_model_name))
        if any(not name for name in self.served_model_name):
            raise ValueError("served_model_name: a name must not be empty")
        if self.api_key_scope not in API_KEY_SCOPES:
            raise ValueError(f"api_key_scope={self.api_key_scope!r}: choose from {API_KEY_SCOPES}")
        for name in ("max_num_prompts", "max_n", "max_sequences_per_request", "max_num_tools"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_stop_sequences < 0 or self.max_engine_restarts < 0 or self.engine_restart_backoff_s < 0:
            raise ValueError("max_stop_sequences, max_engine_restarts and engine_restart_backoff_s must be >= 0")
        if self.max_tokens_per_request is not None and self.max_tokens_per_request < 1:
            raise ValueError(f"max_tokens_per_request must be >= 1, got {self.max_tokens_per_request}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.api_key == "":
            object.__setattr__(self, "api_key", None)

    def replace(self, **changes: Any) -> ServerConfig:
        return dataclasses.replace(self, **changes)
