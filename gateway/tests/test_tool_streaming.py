"""Tool calls (tool_choice auto, hermes and llama3_json) and <think> reasoning through the whole HTTP
path, streamed and not, with the openai client. The model is the scripted fake engine (in-process), so
the output is exactly the tagged text these parsers must read; the real model is too small to emit it.
"""

import json

import openai
import pytest
from gateway_fake_engine import FakeAsyncLLM
from lightspeed import default_model
from lightspeed_gateway.config import ServerConfig
from lightspeed_gateway.server.app import build_app
from starlette.testclient import TestClient

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
HERMES_REPLY = ('<think>The user wants weather.</think>\nChecking.\n<tool_call>\n{"name": "get_weather", '
                '"arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
                '"arguments": {"city": "Oslo"}}\n</tool_call>')
MODEL = "SmolLM2-135M-Instruct.Q4_1"
LLAMA_REPLY = '{"name": "get_weather", "parameters": {"city": "Rome"}}'


def make_client(parser: str, reasoning: str | None):
    config = ServerConfig(tool_call_parser=parser, reasoning_parser=reasoning)
    app = build_app(config, lambda: FakeAsyncLLM(default_model(), token_delay_s=0), model_path=default_model())
    http = TestClient(app)
    http.__enter__()  # runs the lifespan (engine start)
    return http, openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


@pytest.fixture(scope="module")
def hermes():
    http, client = make_client("hermes", "think")
    yield client
    http.__exit__(None, None, None)


@pytest.fixture(scope="module")
def llama3():
    http, client = make_client("llama3_json", None)
    yield client
    http.__exit__(None, None, None)


def ask(text):
    return [{"role": "user", "content": f"SAY:{text}"}]


def test_hermes_non_streaming(hermes):
    resp = hermes.chat.completions.create(model=MODEL, messages=ask(HERMES_REPLY), tools=TOOLS, max_tokens=200)
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking.\n"
    assert choice.message.model_extra["reasoning_content"] == "The user wants weather."
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert calls[0].id != calls[1].id


def test_hermes_streaming_matches(hermes):
    stream = hermes.chat.completions.create(model=MODEL, messages=ask(HERMES_REPLY), tools=TOOLS, max_tokens=200,
                                            stream=True)
    content, reasoning, calls, finish, argument_pieces = "", "", {}, None, 0
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"name": None, "arguments": "", "id": None})
            if piece.id:
                call["id"], call["name"] = piece.id, piece.function.name
            if piece.function.arguments:
                call["arguments"] += piece.function.arguments
                argument_pieces += 1
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "Checking.\n" and reasoning == "The user wants weather."
    assert [json.loads(calls[i]["arguments"]) for i in sorted(calls)] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert all(c["id"] and c["name"] == "get_weather" for c in calls.values())
    assert argument_pieces > 4  # arguments arrive token by token, not in one piece


def test_tool_choice_none_leaves_text_alone(hermes):
    resp = hermes.chat.completions.create(model=MODEL, messages=ask(HERMES_REPLY), tools=TOOLS, tool_choice="none",
                                          max_tokens=200)
    assert resp.choices[0].message.tool_calls in (None, [])
    assert "<tool_call>" in resp.choices[0].message.content


def test_llama3_json(llama3):
    resp = llama3.chat.completions.create(model=MODEL, messages=ask(LLAMA_REPLY), tools=TOOLS, max_tokens=100)
    call = resp.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Rome"}
    assert resp.choices[0].message.content is None and resp.choices[0].finish_reason == "tool_calls"
    pieces = [d for c in llama3.chat.completions.create(model=MODEL, messages=ask(LLAMA_REPLY), tools=TOOLS,
                                                        max_tokens=100, stream=True)
              if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"city": "Rome"}
    plain = llama3.chat.completions.create(model=MODEL, messages=ask("Just text."), tools=TOOLS, max_tokens=100)
    assert plain.choices[0].message.content == "Just text." and not plain.choices[0].message.tool_calls
