"""OpenAI Responses wire models (pydantic), requests only; items and responses are plain dicts.

Input items are validated in `convert.py` (each kind has its own fields and error message), so
what is stored is exactly the normalised item list. Fields we do not act on (include, service
tier, safety identifier, ...) are accepted and ignored, as newer clients send them routinely.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Loose = ConfigDict(extra="ignore")


class FunctionTool(BaseModel):
    model_config = Loose
    type: str = "function"
    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z0-9_.\-]+$")] | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _function(self) -> FunctionTool:
        if self.type != "function":
            raise ValueError(f"tool type {self.type!r} is not supported; only function tools are")
        if not self.name:
            raise ValueError("a function tool needs a name")
        return self


class NamedToolChoice(BaseModel):
    model_config = Loose
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    model_config = Loose
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("text.format.schema is required when text.format.type is 'json_schema'")
        return self


class TextConfig(BaseModel):
    model_config = Loose
    format: TextFormat | None = None


class Reasoning(BaseModel):
    model_config = Loose
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(BaseModel):
    model_config = Loose
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: Annotated[str, Field(max_length=512)] | None = None
    truncation: Literal["auto", "disabled"] | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponsesRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            if self.tool_choice.name not in {t.name for t in self.tools or ()}:
                raise ValueError(f"tool_choice names an unknown function {self.tool_choice.name!r}")
        elif self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' requires tools")
        if self.background and not self.store:
            raise ValueError("background responses must be stored (store=true)")
        if self.background and self.stream:
            raise ValueError("background=true with stream=true is not supported; poll GET /v1/responses/{id}")
        return self
