"""The official `anthropic` client against `lightspeed serve` (default model): /v1/messages and count_tokens."""

import json

import anthropic
import httpx
import pytest
from gateway_testing import requires_real_engine

PAGE = 16
GREEDY = {"temperature": 0}  # through extra_body: this SDK version no longer has sampling arguments
WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                            "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(base_url):
    return anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(base_url):
    return httpx.get(base_url + "/v1/models").json()["data"][0]["id"]


def billing_header(n: int) -> dict:
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.{n}.{n:03x}; cc_entrypoint=cli; "
                                    f"cch={n * 7919 % 100000:05d};"}


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_message_and_usage(client, model):
    msg = client.messages.create(model=model, max_tokens=12, system="You are terse.",
                                 messages=[{"role": "user", "content": "Name a colour."}], extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens") and 0 < msg.usage.output_tokens <= 12
    counted = client.messages.count_tokens(model=model, system="You are terse.",
                                           messages=[{"role": "user", "content": "Name a colour."}])
    assert prompt_tokens(msg.usage) == counted.input_tokens > 5


def test_stream_events_and_text_match(client, model, base_url):
    ask = {"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "Say hello."}], **GREEDY}
    whole = client.messages.create(**{k: v for k, v in ask.items() if k != "temperature"}, extra_body=GREEDY)
    with httpx.stream("POST", base_url + "/v1/messages", json={**ask, "stream": True}, timeout=120) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == names
    text = "".join(d["delta"]["text"] for d in datas if d["type"] == "content_block_delta")
    assert text == whole.content[0].text
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == whole.stop_reason and delta["usage"]["output_tokens"] == whole.usage.output_tokens
    with client.messages.stream(model=model, max_tokens=10, messages=ask["messages"], extra_body=GREEDY) as stream:
        assert stream.get_final_message().content[0].text == whole.content[0].text


def test_stop_sequence(client, model):
    msg = client.messages.create(model=model, max_tokens=30, stop_sequences=["3"],
                                 messages=[{"role": "user", "content": "Count: 1, 2, 3, 4, 5. Now count from 1 to 5."}],
                                 extra_body=GREEDY)
    if msg.stop_reason == "stop_sequence":  # the model may end first; when it stops on "3", it says so
        assert msg.stop_sequence == "3" and "3" not in msg.content[0].text
    else:
        assert msg.stop_reason in ("end_turn", "max_tokens") and "3" not in msg.content[0].text


@requires_real_engine
def test_tool_use_round_trip(client, model, base_url):
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    msg = client.messages.create(model=model, max_tokens=40, tools=[WEATHER], tool_choice=forced, messages=ask,
                                 extra_body=GREEDY)
    assert msg.stop_reason == "tool_use"
    call = next(b for b in msg.content if b.type == "tool_use")
    assert call.name == "get_weather" and call.input["city"] in ("Paris", "Oslo") and call.id.startswith("toolu_")
    # Streaming: the arguments arrive as input_json_delta pieces that add up to the same input.
    with client.messages.stream(model=model, max_tokens=40, tools=[WEATHER], tool_choice=forced, messages=ask,
                                extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"
              and e.delta.type == "input_json_delta"]
    assert pieces and json.loads("".join(pieces)) == call.input
    assert next(b for b in final.content if b.type == "tool_use").input == call.input
    # The result goes back in; tool_choice none answers in text.
    follow = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18C, sunny"}]}]
    answer = client.messages.create(model=model, max_tokens=16, tools=[WEATHER], tool_choice={"type": "none"},
                                    messages=follow, extra_body=GREEDY)
    assert answer.content[0].type == "text" and answer.content[0].text and answer.stop_reason != "tool_use"
    assert answer.usage.cache_read_input_tokens >= prompt_tokens(msg.usage) // PAGE * PAGE


def _claude_code_turns(client, model, turns: int):
    """A Claude-Code-like session: a changing billing header block, a long system prompt with a
    breakpoint, system reminders, and the rolling cache_control breakpoint on the last message."""
    system = [None, {"type": "text", "text": "You are an interactive CLI coding agent. Follow the rules. " * 12,
                     "cache_control": {"type": "ephemeral"}}]
    history: list[dict] = []
    usages = []
    for turn in range(turns):
        system[0] = billing_header(turn + 1)
        for message in history:  # the breakpoint rolls forward: older turns lose theirs
            if isinstance(message["content"], list):
                for block in message["content"]:
                    block.pop("cache_control", None)
        history.append({"role": "user", "content": [
            {"type": "text", "text": f"<system-reminder>Turn {turn}: todo list is empty.</system-reminder>"},
            {"type": "text", "text": f"Step {turn}: list one file to edit.", "cache_control": {"type": "ephemeral"}}]})
        msg = client.messages.create(model=model, max_tokens=8, system=system, messages=history,
                                     metadata={"user_id": "user_abc_account__session_1234"}, extra_body=GREEDY)
        usages.append(msg.usage)
        history.append({"role": "assistant", "content": msg.content[0].text})
    return usages


def test_second_turn_reads_the_first_turns_prompt_from_cache(client, model):
    usages = _claude_code_turns(client, model, 3)
    for before, after in zip(usages, usages[1:], strict=False):
        assert after.cache_read_input_tokens >= prompt_tokens(before) // PAGE * PAGE
        # The cached share does not drop though the billing header changed every request.
        assert after.cache_read_input_tokens / prompt_tokens(after) >= 0.5


def test_bad_input_gets_anthropic_errors(client, model):
    cases = [
        [{"role": "user", "content": [{"type": "no_such_block", "text": "x"}]}],
        [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_missing", "content": "x"}]}],
        [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                   "data": "AAAA"}}]}],
    ]
    for messages in cases:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model=model, max_tokens=4, messages=messages)
        body = info.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert body["error"]["message"]
    assert "no_such_block" in _error(client, model, cases[0])
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=model, max_tokens=0, messages=[{"role": "user", "content": "x"}])
    # The server keeps serving.
    assert client.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": "x"}]).content


def _error(client, model, messages) -> str:
    try:
        client.messages.create(model=model, max_tokens=4, messages=messages)
    except anthropic.BadRequestError as e:
        return e.body["error"]["message"]
    raise AssertionError("expected a 400")
