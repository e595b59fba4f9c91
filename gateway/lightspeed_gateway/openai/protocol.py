"""OpenAI wire models (pydantic). Requests forbid unknown fields, as OpenAI does (a typo is a 400 that
names the nearest field); vLLM's extensions (top_k, min_p, repetition_penalty, guided_json, priority,
request_id, ...) are accepted because clients send them through `extra_body`. Fields that are valid
for OpenAI or vLLM but mean nothing here (`reasoning_effort`, `service_tier`, `prompt_logprobs`, ...)
are accepted and ignored; the response then carries a `Warning` header naming them. Ranges follow
OpenAI's documented bounds, so a bad value is a 400 here, not a 500 later.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

StrictModel = ConfigDict(extra="forbid")
LooseModel = ConfigDict(extra="ignore")

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Stop = str | list[str] | None  # at most --max-stop-sequences strings (checked by the handlers)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# ---------------------------------------------------------------------------------------------
# shared pieces
class StreamOptions(BaseModel):
    model_config = StrictModel
    include_usage: bool = False
    continuous_usage_stats: bool = False


class FunctionDefinition(BaseModel):
    model_config = LooseModel
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = LooseModel
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = LooseModel
    name: str


class NamedToolChoice(BaseModel):
    model_config = LooseModel
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = LooseModel
    name: Annotated[str, Field(max_length=64)] = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = StrictModel
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError("response_format.json_schema.schema is required when type is 'json_schema'")
        return self


class FunctionCall(BaseModel):
    model_config = LooseModel
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = LooseModel
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(BaseModel):
    model_config = LooseModel
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """An input message; unknown keys are ignored so a response message can be sent back as is."""

    model_config = LooseModel
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StructuredOutputsField(BaseModel):
    """vLLM's `structured_outputs`: exactly one constraint."""

    model_config = LooseModel
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class IgnoredFields(BaseModel):
    """Valid OpenAI / vLLM request fields without an effect in Lightspeed: accepted, named in the
    response's Warning header (see `ignored_fields`)."""

    reasoning_effort: str | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    web_search_options: dict[str, Any] | None = None
    verbosity: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # vLLM extras whose feature Lightspeed lacks
    prompt_logprobs: int | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    truncate_prompt_tokens: int | None = None
    spaces_between_special_tokens: bool | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    return_tokens_as_token_ids: bool | None = None
    cache_salt: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    def ignored_fields(self) -> list[str]:
        """The ignored fields this request set."""
        return [name for name in IgnoredFields.model_fields if getattr(self, name) is not None]


class SamplingFields(IgnoredFields):
    """Fields common to chat and completions requests."""

    model_config = StrictModel
    model: str | None = None
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    seed: Annotated[int, Field(ge=-(2**63), le=2**64 - 1)] | None = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    user: str | None = None
    # OpenAI's name for the conversation a request belongs to: the engine keeps its cached prefix longer.
    prompt_cache_key: Annotated[str, Field(max_length=512)] | None = None
    # vLLM extensions
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] = 0
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    priority: Annotated[int, Field(ge=-(2**31 - 1), le=2**31 - 1)] = 0  # lower is scheduled earlier
    request_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None  # the response id's suffix
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None
    guided_grammar: str | None = None
    structured_outputs: StructuredOutputsField | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
            if not self.tools:
                raise ValueError("tool_choice requires tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            if self.tool_choice.function.name not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names an unknown function {self.tool_choice.function.name!r}")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


class CompletionRequest(SamplingFields):
    prompt: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[int], Field(min_length=1)] | (
        Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
    )
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


# ---------------------------------------------------------------------------------------------
# responses
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    # Lightspeed's extension: cached_tokens split by the KV tier it came from, {"device", "host", "disk"}.
    cached_tokens_by_tier: dict[str, int] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None  # null when the answer has none, as OpenAI sends


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: Literal["stop", "length", "tool_calls", "abort"] | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "lightspeed"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeCompletionRequest(BaseModel):
    model_config = StrictModel
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(BaseModel):
    model_config = StrictModel
    model: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_generation_prompt: bool = True
    tools: list[Tool] | None = None


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(BaseModel):
    model_config = StrictModel
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(BaseModel):
    prompt: str


class HealthResponse(BaseModel):
    status: Literal["ok", "restarting", "dead"]
    engines: list[Literal["ok", "restarting", "dead"]] | None = Field(
        None, description="Per data-parallel engine core that fails alone (absent otherwise): the server is ok "
                          "while one of them is.")


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
