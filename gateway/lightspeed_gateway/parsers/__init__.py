"""Streaming parsers for model output: reasoning (`<think>`) and tool calls (hermes, llama3_json).

Every parser is a state machine fed text deltas in arrival order; it returns what became certain
with that delta and holds back only what could still turn into a tag. Feeding the whole text at
once (non-streaming) and feeding it one character at a time give the same result.
"""

from lightspeed_gateway.parsers.base import ParsedDelta, ToolCallDelta, ToolParser, collect
from lightspeed_gateway.parsers.reasoning import ThinkReasoningParser
from lightspeed_gateway.parsers.tools import (
    TOOL_PARSERS,
    HermesToolParser,
    JsonStreamToolParser,
    Llama3JsonToolParser,
    NamedToolParser,
    make_tool_parser,
)

REASONING_PARSERS = {"think": ThinkReasoningParser, "deepseek_r1": ThinkReasoningParser, "qwen3": ThinkReasoningParser}

__all__ = [
    "ParsedDelta",
    "ToolCallDelta",
    "ToolParser",
    "collect",
    "ThinkReasoningParser",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "JsonStreamToolParser",
    "NamedToolParser",
    "TOOL_PARSERS",
    "REASONING_PARSERS",
    "make_tool_parser",
]
