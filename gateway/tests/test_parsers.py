"""Streaming parsers: every split of the same output gives the same result as parsing it whole."""

import json

import pytest
from lightspeed_gateway.parsers import (
    HermesToolParser,
    JsonStreamToolParser,
    Llama3JsonToolParser,
    ThinkReasoningParser,
    collect,
)
from lightspeed_gateway.parsers.base import counter_call_ids

HERMES_OUTPUTS = [
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n',
    '<tool_call>{"name": "a", "arguments": {"x": "}{<tool_call>\\"", "y": [1, {"z": 2}]}}</tool_call>\n'
    '<tool_call>{"arguments": {"q": 1}, "name": "b"}</tool_call>',
    "no tools here, just <tool text and </tool_call> noise",
    '<tool_call>{"name": "f"}</tool_call>',
    '<tool_call>{"name": "s", "arguments": "{\\"k\\": 3}"}</tool_call> trailing words',
]
LLAMA3_OUTPUTS = [
    '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    '<|python_tag|>{"name": "a", "parameters": {"n": 1}}; {"name": "b", "parameters": {"s": "x;y}"}}',
    "  Plain answer, no call.",
    '{"not_a_call": 1}',
]


def feed_split(make, text, cuts):
    parser = make()
    deltas, start = [], 0
    for cut in [*cuts, len(text)]:
        deltas.append(parser.feed(text[start:cut]))
        start = cut
    deltas.append(parser.finish())
    return collect(deltas), parser.tool_calls


def all_splits(make, text):
    """Whole, one character at a time, and cut at every boundary (two pieces)."""
    yield feed_split(make, text, [])
    yield feed_split(make, text, list(range(1, len(text))))
    for cut in range(1, len(text)):
        yield feed_split(make, text, [cut])


@pytest.mark.parametrize("text", HERMES_OUTPUTS)
def test_hermes_every_split_agrees(text):
    results = list(all_splits(lambda: HermesToolParser(counter_call_ids()), text))
    assert all(r == results[0] for r in results)


@pytest.mark.parametrize("text", LLAMA3_OUTPUTS)
def test_llama3_every_split_agrees(text):
    results = list(all_splits(lambda: Llama3JsonToolParser(counter_call_ids()), text))
    assert all(r == results[0] for r in results)


def test_hermes_result():
    (parsed, calls) = feed_split(lambda: HermesToolParser(counter_call_ids()), HERMES_OUTPUTS[1], [])
    assert parsed["content"] == ""
    assert [c["name"] for c in parsed["tool_calls"]] == ["a", "b"]
    assert json.loads(parsed["tool_calls"][0]["arguments"]) == {"x": '}{<tool_call>"', "y": [1, {"z": 2}]}
    assert json.loads(parsed["tool_calls"][1]["arguments"]) == {"q": 1}
    assert calls == [{"id": "call_0", **{k: parsed["tool_calls"][0][k] for k in ("name", "arguments")}},
                     {"id": "call_1", **{k: parsed["tool_calls"][1][k] for k in ("name", "arguments")}}]
    parsed, _ = feed_split(lambda: HermesToolParser(counter_call_ids()), HERMES_OUTPUTS[0], [])
    assert parsed["content"] == "Let me check.\n"
    parsed, calls = feed_split(lambda: HermesToolParser(counter_call_ids()), HERMES_OUTPUTS[2], [])
    assert parsed["content"] == HERMES_OUTPUTS[2] and calls == []
    parsed, calls = feed_split(lambda: HermesToolParser(counter_call_ids()), HERMES_OUTPUTS[3], [])
    assert calls[0]["arguments"] == "{}"
    parsed, calls = feed_split(lambda: HermesToolParser(counter_call_ids()), HERMES_OUTPUTS[4], [])
    assert json.loads(calls[0]["arguments"]) == {"k": 3} and parsed["content"] == " trailing words"


def test_hermes_streams_arguments_incrementally():
    parser = HermesToolParser(counter_call_ids())
    text = HERMES_OUTPUTS[0]
    arg_pieces = []
    for ch in text:
        for piece in parser.feed(ch).tool_calls:
            if piece.arguments:
                arg_pieces.append(piece.arguments)
    assert len(arg_pieces) > 10  # one per character, not one blob at the end
    assert json.loads("".join(arg_pieces)) == {"city": "Paris", "unit": "c"}


def test_llama3_results():
    parsed, calls = feed_split(lambda: Llama3JsonToolParser(counter_call_ids()), LLAMA3_OUTPUTS[1], [])
    assert [c["name"] for c in calls] == ["a", "b"]
    assert json.loads(calls[1]["arguments"]) == {"s": "x;y}"}
    parsed, calls = feed_split(lambda: Llama3JsonToolParser(counter_call_ids()), LLAMA3_OUTPUTS[2], [])
    assert calls == [] and parsed["content"] == LLAMA3_OUTPUTS[2]
    parsed, calls = feed_split(lambda: Llama3JsonToolParser(counter_call_ids()), LLAMA3_OUTPUTS[3], [])
    assert calls == [] and parsed["content"] == LLAMA3_OUTPUTS[3]


def test_required_array_stream():
    text = '[{"name": "a", "parameters": {"v": 1}}, {"name": "b", "parameters": {}}]'
    results = list(all_splits(lambda: JsonStreamToolParser(counter_call_ids()), text))
    assert all(r == results[0] for r in results)
    assert [(c["name"], json.loads(c["arguments"])) for c in results[0][1]] == [("a", {"v": 1}), ("b", {})]


@pytest.mark.parametrize("text", ['[ {"na', "  [", ""])
def test_required_output_cut_before_a_name_comes_back_as_content(text):
    # max_tokens ran out inside the forced array: the text is returned, not dropped
    results = list(all_splits(lambda: JsonStreamToolParser(counter_call_ids()), text)) if text else \
        [feed_split(lambda: JsonStreamToolParser(counter_call_ids()), text, [])]
    for parsed, calls in results:
        assert calls == [] and parsed["content"] == text


def test_required_output_cut_inside_arguments_keeps_the_call():
    parsed, calls = feed_split(lambda: JsonStreamToolParser(counter_call_ids()), '[{"name": "a", "parameters": {"v', [])
    assert [c["name"] for c in calls] == ["a"] and parsed["content"] == ""


THINK_OUTPUTS = [
    "<think>\nI should add 2 and 2.\n</think>\n\nThe answer is 4.",
    "  <think>a < b and </thin k></think>ok",
    "No reasoning at all <think> inside",
    "<thin",
    "<think>unterminated",
]


@pytest.mark.parametrize("text", THINK_OUTPUTS)
def test_think_every_split_agrees(text):
    def run(cuts):
        parser, deltas, start = ThinkReasoningParser(), [], 0
        for cut in [*cuts, len(text)]:
            deltas.append(parser.feed(text[start:cut]))
            start = cut
        deltas.append(parser.finish())
        return collect(deltas)

    results = [run([]), run(list(range(1, len(text))))] + [run([c]) for c in range(1, len(text))]
    assert all(r == results[0] for r in results)


def test_think_results():
    parser = ThinkReasoningParser()
    out = collect([parser.feed(THINK_OUTPUTS[0]), parser.finish()])
    assert out["reasoning"] == "\nI should add 2 and 2.\n" and out["content"] == "The answer is 4."
    parser = ThinkReasoningParser()
    out = collect([parser.feed(THINK_OUTPUTS[2]), parser.finish()])
    assert out["reasoning"] == "" and out["content"] == THINK_OUTPUTS[2]
    parser = ThinkReasoningParser(start_in_reasoning=True)
    out = collect([parser.feed("plan</think>done"), parser.finish()])
    assert out == {"reasoning": "plan", "content": "done", "tool_calls": []}


def test_reasoning_then_tools_pipeline():
    text = '<think>need weather</think>\n<tool_call>{"name": "w", "arguments": {"c": "Oslo"}}</tool_call>'
    for cut_every in (1, 3, 7, len(text)):
        reasoning, tools, deltas = ThinkReasoningParser(), HermesToolParser(counter_call_ids()), []
        for i in range(0, len(text), cut_every):
            step = reasoning.feed(text[i : i + cut_every])
            deltas.append(step)
            deltas.append(tools.feed(step.content))
        tail = reasoning.finish()
        deltas += [tail, tools.feed(tail.content), tools.finish()]
        out = collect(deltas)
        assert out["reasoning"] == "need weather"
        assert out["tool_calls"] == [{"id": "call_0", "name": "w", "arguments": '{"c": "Oslo"}'}]
