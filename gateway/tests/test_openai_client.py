"""The real `openai` client against `lightspeed serve` on the default model (sync, async, streaming)."""

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest
from gateway_testing import requires_real_engine

USER = [{"role": "user", "content": "SAY:The capital of France is Paris. It is a big city."}]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def test_models_version_health(client, base_url):
    models = client.models.list().data
    assert len(models) == 1 and models[0].id == "SmolLM2-135M-Instruct"  # not the file's "...Instruct.Q4_1"
    assert httpx.get(base_url + "/health").status_code == 200
    assert httpx.get(base_url + "/version").json()["version"] == "0.1.0"


def test_chat_non_streaming(client, model):
    resp = client.chat.completions.create(model=model, messages=USER, **GREEDY)
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = resp.usage
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streaming_matches_non_streaming(client, model):
    whole = client.chat.completions.create(model=model, messages=USER, **GREEDY)
    chunks = list(client.chat.completions.create(model=model, messages=USER, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_sse_wire_format_ends_with_done(base_url, model):
    body = {"model": model, "messages": USER, "stream": True, **GREEDY}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [line for line in resp.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1])


def test_async_client_concurrent_streams(base_url, model):
    async def run():
        client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)

        async def one(i):
            stream = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"SAY:number {i}"}], stream=True,
                max_tokens=8, temperature=0)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        texts = await asyncio.gather(*(one(i) for i in range(4)))
        await client.close()
        return texts

    texts = asyncio.run(run())
    assert len(texts) == 4 and all(texts)


def test_max_tokens_and_max_completion_tokens_give_length(client, model):
    for limit in ({"max_tokens": 5}, {"max_completion_tokens": 5}):
        resp = client.chat.completions.create(model=model, messages=USER, temperature=0,
                                              extra_body={"ignore_eos": True}, **limit)
        assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 5


def test_n_choices(client, model):
    resp = client.chat.completions.create(model=model, messages=USER, n=3, max_tokens=6, temperature=1.0, seed=7)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    assert 3 <= resp.usage.completion_tokens <= 18
    stream = client.chat.completions.create(model=model, messages=USER, n=2, max_tokens=6, stream=True)
    indices = {choice.index for c in stream for choice in c.choices}
    assert indices == {0, 1}


def test_stop_string_is_not_returned(client, model):
    text = client.chat.completions.create(model=model, messages=USER, **GREEDY).choices[0].message.content
    words = re.findall(r"[A-Za-z]{3,}", text)
    assert len(words) >= 2, text
    stop = words[1]
    resp = client.chat.completions.create(model=model, messages=USER, stop=[stop], **GREEDY)
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == text[: text.index(stop)]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=USER, stop=stop, stream=True, **GREEDY) if c.choices)
    assert streamed == text[: text.index(stop)]


def test_stop_token_ids(client, model, base_url):
    resp = client.completions.create(model=model, prompt="SAY:one two three four five", max_tokens=8,
                                     temperature=0, logprobs=0)
    tokens = resp.choices[0].logprobs.tokens
    assert len(tokens) >= 4
    ids = httpx.post(base_url + "/tokenize", json={"prompt": tokens[2], "add_special_tokens": False}).json()["tokens"]
    assert len(ids) == 1
    stopped = client.completions.create(model=model, prompt="SAY:one two three four five", max_tokens=8,
                                        temperature=0, extra_body={"stop_token_ids": ids})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens <= 3


def test_seed_makes_sampling_reproducible(client, model):
    kwargs = dict(model=model, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12,
                  temperature=1.0, top_p=0.95, seed=1234)
    a = client.chat.completions.create(**kwargs).choices[0].message.content
    b = client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_sampling_knobs_accepted(client, model):
    resp = client.chat.completions.create(
        model=model, messages=USER, max_tokens=6, temperature=0.7, top_p=0.9, presence_penalty=0.5,
        frequency_penalty=0.5, user="u-1", extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    assert resp.choices[0].message.content is not None


@requires_real_engine
def test_logit_bias_forces_a_token(client, model, base_url):
    token = httpx.post(base_url + "/tokenize", json={"prompt": " banana", "add_special_tokens": False}).json()["tokens"]
    assert len(token) == 1
    resp = client.chat.completions.create(model=model, messages=USER, max_tokens=4, temperature=0,
                                          logit_bias={str(token[0]): 100})
    assert resp.choices[0].message.content == " banana" * 4


def test_chat_logprobs(client, model):
    resp = client.chat.completions.create(model=model, messages=USER, max_tokens=5, temperature=0, logprobs=True,
                                          top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
    assert "".join(i.token for i in content) .startswith(resp.choices[0].message.content[:3])


def test_completions_echo_logprobs_and_batches(client, model):
    resp = client.completions.create(model=model, prompt="SAY:hello there", max_tokens=4, temperature=0, echo=True)
    assert resp.choices[0].text.startswith("SAY:hello there")
    resp = client.completions.create(model=model, prompt="SAY:hello there", max_tokens=4, temperature=0, logprobs=2)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == resp.usage.completion_tokens
    assert all(len(t) >= 1 for t in lp.top_logprobs)
    batch = client.completions.create(model=model, prompt=["SAY:a b c", "SAY:x y z"], max_tokens=3, n=2,
                                      temperature=0)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    ids = client.completions.create(model=model, prompt=[1, 2, 3, 4], max_tokens=3)
    assert ids.usage.prompt_tokens == 4
    stream = list(client.completions.create(model=model, prompt="SAY:hello there", max_tokens=4, stream=True,
                                            temperature=0, stream_options={"include_usage": True}))
    assert stream[-1].usage.completion_tokens >= 1


def test_tokenize_detokenize_roundtrip(base_url, model):
    tokens = httpx.post(base_url + "/tokenize", json={"model": model, "prompt": "Hello world"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 1024
    text = httpx.post(base_url + "/detokenize", json={"model": model, "tokens": tokens["tokens"]}).json()
    assert text["prompt"] == "Hello world"
    chat = httpx.post(base_url + "/tokenize", json={"messages": USER}).json()
    assert chat["count"] > tokens["count"]


def test_second_turn_hits_the_prefix_cache(client, model):
    page_size = 16
    first_messages = [{"role": "system", "content": "You are a careful assistant. " * 12}] + USER
    first = client.chat.completions.create(model=model, messages=first_messages, **GREEDY)
    second_messages = first_messages + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "SAY:And what about Spain?"}]
    second = client.chat.completions.create(model=model, messages=second_messages, **GREEDY)
    floor = first.usage.prompt_tokens // page_size * page_size
    assert second.usage.prompt_tokens_details.cached_tokens >= floor


@requires_real_engine
def test_response_format_json_schema_validates(client, model):
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                                               "sunny": {"type": "boolean"}},
              "required": ["city", "sunny"], "additionalProperties": False}
    for stream in (False, True):
        kwargs = dict(model=model, messages=[{"role": "user", "content": "Pick a city and say if it is sunny."}],
                      max_tokens=40, temperature=0.8, seed=3,
                      response_format={"type": "json_schema",
                                       "json_schema": {"name": "pick", "schema": schema, "strict": True}})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **kwargs) if c.choices)
        else:
            text = client.chat.completions.create(**kwargs).choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


@requires_real_engine
def test_response_format_json_object(client, model):
    resp = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": 'Reply with a JSON object like {"name": "Tom"}.'}],
        max_tokens=48, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                                                  "enum": ["UTC", "CET"]}},
                                           "required": ["zone"], "additionalProperties": False}}}]


@requires_real_engine
def test_tool_choice_named_and_required(client, model):
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    named = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=40, temperature=0,
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and named.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    required = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=80,
                                              temperature=0, tool_choice="required", parallel_tool_calls=False)
    calls = required.choices[0].message.tool_calls
    assert calls and required.choices[0].finish_reason == "tool_calls"
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])
    # Cut at max_tokens inside the forced array: what the model wrote comes back (as the call begun,
    # or as content before any name closed), never an empty message.
    for budget in (1, 6):
        cut = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=budget,
                                             temperature=0, tool_choice="required")
        message = cut.choices[0].message
        assert cut.choices[0].finish_reason == "length" and (message.content or message.tool_calls), message
    # Streaming: name first, arguments in pieces that concatenate to valid JSON.
    stream = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, max_tokens=40,
                                            temperature=0, stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    pieces = [d for c in stream if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert pieces[0].function.name == "get_weather" and pieces[0].id
    assert len(pieces) > 1
    jsonschema.validate(json.loads("".join(p.function.arguments or "" for p in pieces)),
                        TOOLS[0]["function"]["parameters"])
    # A tool result goes back in; tool_choice none answers in text.
    follow = ask + [named.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"}]
    final = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, tool_choice="none",
                                           max_tokens=6, temperature=0)
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content


def test_metrics_count_requests(base_url):
    text = httpx.get(base_url + "/metrics").text
    for name in ("lightspeed:request_success_total", "lightspeed:time_to_first_token_seconds_bucket",
                 "lightspeed:inter_token_latency_seconds_bucket", "lightspeed:e2e_request_latency_seconds_bucket",
                 "lightspeed:prompt_tokens_total", "lightspeed:generation_tokens_total",
                 "lightspeed:prefix_cache_hit_tokens_total", "lightspeed:num_requests_running",
                 "lightspeed:num_requests_waiting", "lightspeed:kv_cache_usage_perc"):
        assert name in text, name
    finished = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("lightspeed:request_success_total{"))
    assert finished >= 10
    assert 'finished_reason="length"' in text and 'finished_reason="stop"' in text
