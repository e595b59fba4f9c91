"""Anthropic Messages wire models (pydantic), requests only: responses are built as plain dicts.

Content blocks are a tagged union on `type`, so an unknown block type is a 400 naming it. Top-level
fields we do not use (service_tier, container, context_management, ...) are ignored rather than
refused: Claude Code sends beta fields as they appear, and none of them changes what we compute.
`cache_control` is accepted on every block and tool and has no effect on rendering (see convert.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Loose = ConfigDict(extra="ignore")


class TextBlock(BaseModel):
    model_config = Loose
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class ImageBlock(BaseModel):
    model_config = Loose
    type: Literal["image"]
    source: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class DocumentBlock(BaseModel):
    model_config = Loose
    type: Literal["document"]
    source: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolUseBlock(BaseModel):
    model_config = Loose
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(BaseModel):
    model_config = Loose
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]] | None = None
    is_error: bool = False
    cache_control: dict[str, Any] | None = None


class ThinkingBlock(BaseModel):
    model_config = Loose
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(BaseModel):
    model_config = Loose
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                  | RedactedThinkingBlock, Field(discriminator="type")]


class Message(BaseModel):
    model_config = Loose
    # "system" inside messages is not in Anthropic's schema, but clients built on Claude Code inject
    # such turns mid-conversation; they are rendered where they stand (never hoisted: that would
    # shift the whole prefix every time one is added).
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class ToolDefinition(BaseModel):
    model_config = Loose
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_.\-]+$")]
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None  # None / "custom": a client tool; anything else is a server tool
    cache_control: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _client_tool(self) -> ToolDefinition:
        if self.type not in (None, "custom"):
            raise ValueError(f"server tool {self.type!r} is not supported; define client tools with input_schema")
        if self.input_schema is None:
            raise ValueError("tools: input_schema is required")
        return self


class ToolChoice(BaseModel):
    model_config = Loose
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice.name is required when tool_choice.type is 'tool'")
        return self


class Thinking(BaseModel):
    model_config = Loose
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None


class OutputFormat(BaseModel):
    model_config = Loose
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = Loose
    effort: str | None = None  # accepted; the engine has no effort knob
    format: OutputFormat | None = None  # enforced by the engine's grammar sampler


class Metadata(BaseModel):
    model_config = Loose
    user_id: Annotated[str, Field(max_length=512)] | None = None


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    """Anthropic's error body (for the OpenAPI document)."""

    type: Literal["error"] = "error"
    error: ErrorDetail


class CountTokensRequest(BaseModel):
    """The input half of a Messages request (what count_tokens measures)."""

    model_config = Loose
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="after")
    def _tools(self) -> CountTokensRequest:
        if self.tool_choice is not None and self.tool_choice.type == "tool":
            if self.tool_choice.name not in {t.name for t in self.tools or ()}:
                raise ValueError(f"tool_choice names an unknown tool {self.tool_choice.name!r}")
        elif self.tool_choice is not None and self.tool_choice.type == "any" and not self.tools:
            raise ValueError("tool_choice 'any' requires tools")
        return self


class MessagesRequest(CountTokensRequest):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[str], Field(max_length=16)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
