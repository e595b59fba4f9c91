"""Messages between the client (AsyncLLM, in the caller's process) and the engine core process.

msgspec structs, msgpack-encoded, one ZMQ frame each. Client -> core: `AddRequest`, `AbortRequests`,
`Shutdown` (a tagged union, `ClientMessage`). Core -> client: `Ready` once, then `StepOutputs` per
engine step, `RequestErrors` for requests the core rejected or that failed while running (the
others carry on), `EngineFailure` when the core dies of an exception (`CoreMessage`).
"""

from __future__ import annotations

import msgspec


class SamplingSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """The part of SamplingParams the core needs (stop strings stay in the client)."""

    max_tokens: int                             # most new tokens (already capped by the client; core re-caps)
    temperature: float = 1.0                    # 0 = greedy
    top_p: float = 1.0                          # 1 = off
    top_k: int = 0                              # <= 0 = off
    min_p: float = 0.0                          # 0 = off
    seed: int | None = None                     # None = drawn from the engine's seed
    min_tokens: int = 0                         # EOS / stop ids masked before this many outputs
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None  # token id -> additive bias
    logprobs: int | None = None                 # top-n logprobs per output token; None = none
    stop_token_ids: list[int] = []              # finish on these (besides EOS)
    eos_token_ids: list[int] = []               # the model's EOS ids (from the client's tokenizer/config)
    ignore_eos: bool = False
    structured_kind: str | None = None          # "json_schema" | "json_object" | "regex" | "grammar"
    structured_spec: str | None = None          # schema / regex / grammar text


class AddRequest(msgspec.Struct, tag="add", frozen=True):
    request_id: str                 # unique among live requests (the client's id)
    prompt_token_ids: list[int]     # tokenised prompt
    sampling: SamplingSpec
    priority: int = 0               # vLLM semantics: lower value = scheduled earlier (core negates it)
    session_id: str | None = None   # the conversation it belongs to: its cached prefix is kept longer


class AbortRequests(msgspec.Struct, tag="abort", frozen=True):
    request_ids: list[str]          # unknown or already-finished ids are ignored


class Shutdown(msgspec.Struct, tag="shutdown", frozen=True):
    pass


ClientMessage = AddRequest | AbortRequests | Shutdown


class EngineStats(msgspec.Struct, frozen=True):
    """A metrics snapshot of the core (the gateway's /metrics reads it)."""

    num_running: int                # requests decoding or prefilling
    num_waiting: int                # requests not yet scheduled
    num_retracted: int              # requests swapped out under memory pressure
    kv_usage: float                 # fraction of device KV pages held by requests (0..1); reusable cached pages count as free
    num_device_pages: int
    free_device_pages: int
    free_host_pages: int
    prefix_hit_tokens: int          # cumulative prompt tokens served from the prefix cache
    prefix_query_tokens: int        # cumulative prompt tokens looked up in the prefix cache
    num_steps: int                  # engine steps run so far
    num_generated_tokens: int       # tokens sampled so far
    timestamp: float                # time.time() of the snapshot
    cached_device_pages: int = 0    # device pages holding prefix-cache KV (shared by requests or reusable)
    num_prefill_tokens: int = 0     # cumulative prompt tokens computed (prefix-cache hits excluded)
    # Per KV tier. Hits: prompt tokens of prefix_hit_tokens served from each tier. Bytes: cumulative.
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    disk_hit_tokens: int = 0
    host_bytes_written: int = 0     # device -> host copies (write-through, retraction)
    host_bytes_read: int = 0        # host -> device copies (host hits, readmission, pages read from disk)
    disk_bytes_written: int = 0     # host -> disk
    disk_bytes_read: int = 0        # disk -> host, verified
    disk_read_failures: int = 0     # disk records that failed their checks: recomputed, never served
    disk_write_errors: int = 0      # writes that did not happen (the first one stops disk writes)
    cached_disk_pages: int = 0      # prefix-cache pages on disk
    expert_load: list[int] | None = None  # MoE models: tokens routed to each expert so far (all layers)
    # Speculative decoding (0 / empty without it), cumulative.
    spec_num_drafts: int = 0                 # decode rows that carried drafts
    spec_num_draft_tokens: int = 0           # draft tokens verified
    spec_num_accepted_tokens: int = 0        # of those, accepted
    spec_acceptance_lengths: list[int] = []  # [n]: rows with drafts that kept n tokens (n = 1..k+1)


class TokenLogprobs(msgspec.Struct, array_like=True, frozen=True):
    """Logprobs of one sampled token."""

    logprob: float                  # of the sampled token
    rank: int                       # its rank among all tokens (1 = most likely)
    top_ids: list[int]              # the top-n token ids, most likely first
    top_logprobs: list[float]


class StepOutputs(msgspec.Struct, tag="outputs", frozen=True):
    """What one engine step produced, columnar: entry i of each list belongs to request_ids[i]."""

    # Entry i: request_ids[i] got token_ids[i]. With speculative decoding a request may appear
    # several times in one step, its tokens in order.
    request_ids: list[str]                              # requests that got a token this step
    token_ids: list[int]                                # the token
    logprobs: dict[str, list[TokenLogprobs]] | None = None  # per request that asked: one per token, in order
    num_cached_tokens: dict[str, int] | None = None     # set on a request's first token
    finished: dict[str, str] | None = None              # request id -> "stop" | "length" | "abort"
    stats: EngineStats | None = None                    # at most every stats interval
    # With num_cached_tokens: the same tokens split by the tier they came from, [device, host, disk].
    cached_tokens_by_tier: dict[str, list[int]] | None = None


class RequestErrors(msgspec.Struct, tag="errors", frozen=True):
    errors: dict[str, str]          # request id -> message: rejected at admission (its input is invalid)
    failed: dict[str, str] = {}     # request id -> message: failed while running (finish reason "error";
                                    # the engine's fault, not the input's); tokens sent before it stand


class Ready(msgspec.Struct, tag="ready", frozen=True):
    """Sent once the model is loaded and the KV cache allocated."""

    pid: int
    vocab_size: int                 # rows of the LM head
    max_model_len: int              # effective limit (prompt + output)
    num_device_pages: int
    num_host_pages: int
    page_size: int
    device: str
    dtype: str
    kv_cache_dtype: str
    eos_token_ids: list[int]        # from the model's config/generation config, if it names any
    rank_pids: list[int] = []       # the other tensor/expert-parallel rank processes this core started
    steps_with_others: bool = False  # data-parallel cores share one world: they die and restart together


class EngineFailure(msgspec.Struct, tag="failure", frozen=True):
    message: str                    # the exception that killed the core, with its traceback (for the log)
    user_error: bool = False        # a bad configuration or model at start-up: message is the one-line reason
    reason: str = ""                # one line the client may show (no traceback), e.g. which rank died


CoreMessage = Ready | StepOutputs | RequestErrors | EngineFailure

encoder = msgspec.msgpack.Encoder()
client_decoder = msgspec.msgpack.Decoder(CoreMessage)      # used by the client
core_decoder = msgspec.msgpack.Decoder(ClientMessage)      # used by the core
