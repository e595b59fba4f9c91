"""The official `openai` client's Responses API against `lightspeed serve` (default model)."""

import json
import time

import httpx
import openai
import pytest
from gateway_testing import requires_real_engine

PAGE = 16
INSTRUCTIONS = "You are a careful assistant. Answer briefly. " * 6
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_create_retrieve_delete(client, model):
    r = client.responses.create(model=model, input="Name a colour.", instructions="Be terse.", max_output_tokens=8,
                                temperature=0)
    assert r.id.startswith("resp_") and r.object == "response" and r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output_text
    assert r.usage.input_tokens > 5 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert client.responses.retrieve(r.id).output_text == r.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_previous_response_id_continues_and_hits_the_cache(client, model):
    first = client.responses.create(model=model, input="Name a colour.", instructions=INSTRUCTIONS,
                                    max_output_tokens=8, temperature=0)
    second = client.responses.create(model=model, input="And a fruit?", instructions=INSTRUCTIONS,
                                     previous_response_id=first.id, max_output_tokens=8, temperature=0)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // PAGE * PAGE
    third = client.responses.create(model=model, input="And a city?", instructions=INSTRUCTIONS,
                                    previous_response_id=second.id, max_output_tokens=8, temperature=0)
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens // PAGE * PAGE


def test_stateless_turns_with_prompt_cache_key(client, model):
    """Codex's way: store=false, the whole conversation as input items every turn."""
    items = [{"role": "user", "content": "Name a colour."}]
    first = client.responses.create(model=model, input=items, instructions=INSTRUCTIONS, store=False,
                                    prompt_cache_key="session-42", max_output_tokens=8, temperature=0)
    items += [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
              {"role": "user", "content": [{"type": "input_text", "text": "And a fruit?"}]}]
    second = client.responses.create(model=model, input=items, instructions=INSTRUCTIONS, store=False,
                                     prompt_cache_key="session-42", max_output_tokens=8, temperature=0)
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // PAGE * PAGE
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


def test_chat_and_completions_take_prompt_cache_key_too(client, model):
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "SAY:hi"}],
                                          max_tokens=2, prompt_cache_key="session-42")
    assert chat.choices[0].message.content is not None
    done = client.completions.create(model=model, prompt="Hi", max_tokens=2, extra_body={"prompt_cache_key": "s"})
    assert done.choices[0].text is not None


def test_streaming_events(client, model, base_url):
    whole = client.responses.create(model=model, input="Say hello.", max_output_tokens=8, temperature=0)
    body = {"model": model, "input": "Say hello.", "max_output_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", base_url + "/v1/responses", json=body, timeout=120) as resp:
        lines = [line for line in resp.iter_lines() if line]
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if whole.status == "completed" else "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == whole.output_text == events[-1]["response"]["output"][0]["content"][0]["text"]
    with client.responses.stream(model=model, input="Say hello.", max_output_tokens=8, temperature=0) as stream:
        last = list(stream)[-1]  # (the SDK's get_final_response() wants response.completed only)
    assert last.type == kinds[-1] and last.response.output_text == whole.output_text


@requires_real_engine
def test_function_call_round_trip(client, model):
    forced = {"type": "function", "name": "get_weather"}
    r = client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER], tool_choice=forced,
                                max_output_tokens=40, temperature=0)
    call = next(item for item in r.output if item.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    with client.responses.stream(model=model, input="Weather in Paris?", tools=[WEATHER], tool_choice=forced,
                                 max_output_tokens=40, temperature=0) as stream:
        events = list(stream)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(pieces) == call.arguments
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments
    answer = client.responses.create(
        model=model, previous_response_id=r.id, tools=[WEATHER], tool_choice="none", max_output_tokens=12,
        temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C, sunny"}])
    assert answer.output_text and answer.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens // PAGE * PAGE


def test_background_then_poll_and_cancel(client, model):
    done = client.responses.create(model=model, input="Name a colour.", max_output_tokens=4, background=True)
    assert done.status in ("queued", "in_progress")
    deadline = time.monotonic() + 60
    while client.responses.retrieve(done.id).status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.responses.retrieve(done.id).status in ("completed", "incomplete")
    long = client.responses.create(model=model, input="Write a long story.", max_output_tokens=400, background=True)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled" and client.responses.retrieve(long.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.cancel(client.responses.create(model=model, input="x", max_output_tokens=1).id)
    assert "background" in info.value.body["message"]


def test_bad_input_gets_openai_errors(client, model):
    cases = [
        ({"input": "x", "previous_response_id": "resp_missing"}, "previous_response_id"),
        ({"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "1"}]}, "input"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
         "input[0].content[0]"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, None),
    ]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=model, max_output_tokens=2, **body)
        error = info.value.body
        assert error["type"] == "invalid_request_error" and error["message"], error
        if param is not None:
            assert error["param"] == param, error
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    assert client.responses.create(model=model, input="still fine?", max_output_tokens=2).output
