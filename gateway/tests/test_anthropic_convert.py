"""Anthropic requests -> rendered prompts: each known cache-busting pattern leaves the prefix unchanged."""

import copy

import pytest
from lightspeed import default_model, load_tokenizer
from lightspeed_gateway.anthropic.convert import system_text, to_chat
from lightspeed_gateway.anthropic.protocol import MessagesRequest
from lightspeed_gateway.openai.errors import APIError
from lightspeed_gateway.template import ChatRenderer

SYSTEM = "You are Claude Code, Anthropic's official CLI for Claude.\nBe concise."


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(load_tokenizer(default_model()), cache_tokens=0)


def tokens(renderer, body: dict) -> list[int]:
    messages, tools = to_chat(MessagesRequest(model="m", max_tokens=8, **body))
    return renderer.render(messages, tools=tools).token_ids


def extends(longer: list[int], shorter: list[int]) -> bool:
    return longer[: len(shorter)] == shorter


@pytest.mark.parametrize("header", [
    "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;",
    "x-anthropic-billing-header: cc_version=2.1.245.ff6; cc_entrypoint=sdk-ts; cch=00a1b;",
])
def test_billing_header_block_or_first_line_is_dropped(renderer, header):
    plain = tokens(renderer, {"system": SYSTEM, "messages": [{"role": "user", "content": "hi"}]})
    as_block = tokens(renderer, {"system": [{"type": "text", "text": header}, {"type": "text", "text": SYSTEM}],
                                 "messages": [{"role": "user", "content": "hi"}]})
    as_line = tokens(renderer, {"system": header + "\n" + SYSTEM, "messages": [{"role": "user", "content": "hi"}]})
    assert as_block == plain == as_line
    assert system_text("Talk about x-anthropic-billing-header: values.") != ""  # only a leading header goes


def test_rolling_cache_control_breakpoints_keep_the_prefix(renderer):
    """Claude Code marks the last message with cache_control and moves the mark every turn; a
    string content and a one-block list are the same message."""
    turn1 = {"system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
             "tools": [{"name": "Read", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
             "messages": [{"role": "user", "content": [{"type": "text", "text": "Open main.py",
                                                         "cache_control": {"type": "ephemeral"}}]}]}
    turn2 = copy.deepcopy(turn1)
    turn2["system"][0].pop("cache_control")
    turn2["tools"][0].pop("cache_control")
    turn2["messages"][0]["content"] = "Open main.py"  # breakpoint gone: Claude Code sends a plain string
    turn2["messages"] += [{"role": "assistant", "content": [{"type": "text", "text": "Opened."}]},
                          {"role": "user", "content": [{"type": "text", "text": "Now run it.",
                                                        "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]
    first, second = tokens(renderer, turn1), tokens(renderer, turn2)
    assert extends(second, first) and len(second) > len(first)


def test_system_reminders_render_in_place(renderer):
    """A reminder block at the head of the newest user turn and a trailing mid-conversation system
    turn (`<total_tokens>`) are rendered where they stand: the next turn still extends this one."""
    reminder = {"type": "text", "text": "<system-reminder>The todo list is empty.</system-reminder>"}
    turn1 = {"system": SYSTEM, "messages": [
        {"role": "user", "content": [reminder, {"type": "text", "text": "Fix the bug."}]},
        {"role": "system", "content": "<total_tokens>190000 tokens left</total_tokens>"}]}
    turn2 = copy.deepcopy(turn1)
    turn2["messages"] += [{"role": "assistant", "content": "Fixed."},
                          {"role": "user", "content": [reminder, {"type": "text", "text": "Add a test."}]},
                          {"role": "system", "content": "<total_tokens>185000 tokens left</total_tokens>"}]
    first, second = tokens(renderer, turn1), tokens(renderer, turn2)
    assert extends(second, first)
    text = renderer.tokenizer.decode(second)
    assert text.index("190000") < text.index("Fixed.") < text.index("185000")  # nothing hoisted to the top
    assert text.index(SYSTEM) < text.index("todo list")


def test_tool_use_and_results_convert_in_order(renderer):
    body = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "need a tool", "signature": "s"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "-3C"}]},
                                     {"type": "text", "text": "Thanks"}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    messages, tools = to_chat(MessagesRequest(model="m", max_tokens=8, **body))
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[1].tool_calls[0].function.arguments == '{"city": "Oslo"}'
    assert messages[1].reasoning_content == "need a tool" and messages[2].content == "-3C"
    assert tools[0].function.name == "get_weather"
    text = renderer.render(messages, tools=tools).text
    assert '"arguments": {"city": "Oslo"}' in text and "need a tool" not in text


def test_tool_result_needs_the_previous_tool_use():
    body = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "w", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "x"}]}]}
    with pytest.raises(APIError) as info:
        to_chat(MessagesRequest(model="m", max_tokens=8, **body))
    assert info.value.status == 400 and "toolu_2" in info.value.message
