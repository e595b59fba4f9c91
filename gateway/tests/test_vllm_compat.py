"""A vLLM user's habits, through the real `openai` client: served-name aliases, GET /v1/models/{id},
valid-but-unsupported fields accepted with a Warning header, vLLM extras (guided_*, structured_outputs,
priority, request_id) mapped onto the engine, `tool_calls` null when there are none."""

import json
import re
import threading
import time

import httpx
import openai
import pytest
from gateway_testing import requires_real_engine

USER = [{"role": "user", "content": "Is Paris in France? Answer yes or no."}]


@pytest.fixture(scope="module")
def url(compat_server):
    return compat_server.url


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_list_aliases_and_retrieve_one(client):
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct", "smol"]
    card = client.models.retrieve("smol")
    assert card.id == "smol" and card.max_model_len == 1024
    assert client.models.retrieve("SmolLM2-135M-Instruct.Q4_1").id == "SmolLM2-135M-Instruct.Q4_1"  # file stem
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-9")
    assert info.value.body["code"] == "model_not_found"


def test_any_alias_serves_and_responses_name_the_primary(client):
    resp = client.chat.completions.create(model="smol", messages=USER, max_tokens=2, temperature=0)
    assert resp.model == "SmolLM2-135M-Instruct"


def test_plain_answer_has_null_tool_calls(url):
    body = {"model": "smol", "messages": USER, "max_tokens": 2, "temperature": 0}
    message = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()["choices"][0]["message"]
    assert "tool_calls" in message and message["tool_calls"] is None


def test_valid_but_unsupported_fields_are_accepted_with_a_warning_header(client):
    raw = client.chat.completions.with_raw_response.create(
        model="smol", messages=USER, max_tokens=2, temperature=0, reasoning_effort="low", service_tier="auto",
        extra_body={"prompt_logprobs": 1})
    warning = raw.headers["warning"]
    assert warning.startswith("299 ") and all(f in warning for f in ("reasoning_effort", "service_tier",
                                                                      "prompt_logprobs"))
    assert raw.parse().choices[0].message.content is not None
    plain = client.chat.completions.with_raw_response.create(model="smol", messages=USER, max_tokens=1)
    assert "warning" not in plain.headers


def test_a_misspelt_field_is_still_rejected_with_a_suggestion(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=USER, extra_body={"max_tokenz": 3})
    assert "did you mean max_tokens?" in info.value.body["message"] and info.value.body["param"] == "max_tokenz"


def test_request_id_names_the_response(client):
    resp = client.chat.completions.create(model="smol", messages=USER, max_tokens=1,
                                          extra_body={"request_id": "my-trace-42"})
    assert resp.id == "chatcmpl-my-trace-42"
    text = client.completions.create(model="smol", prompt="Hello", max_tokens=1, extra_body={"request_id": "t-7"})
    assert text.id == "cmpl-t-7"


@requires_real_engine
def test_guided_fields_constrain_the_output(client):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    resp = client.chat.completions.create(model="smol", messages=USER, max_tokens=24, temperature=0,
                                          extra_body={"guided_json": schema})
    assert json.loads(resp.choices[0].message.content)["answer"] in ("yes", "no")
    choice = client.chat.completions.create(model="smol", messages=USER, max_tokens=4, temperature=0,
                                            extra_body={"guided_choice": ["yes", "no"]})
    assert choice.choices[0].message.content in ("yes", "no")
    shaped = client.chat.completions.create(model="smol", messages=USER, max_tokens=3, temperature=0,
                                            extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    assert re.fullmatch(r"[0-9]{3}", shaped.choices[0].message.content)
    text = client.completions.create(model="smol", prompt="Digits:", max_tokens=2, temperature=0,
                                     extra_body={"guided_regex": "[a-c]{2}"})
    assert re.fullmatch(r"[a-c]{2}", text.choices[0].text)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smol", messages=USER, max_tokens=3,
                                       extra_body={"guided_regex": "a", "guided_choice": ["b"]})
    assert "one structured-output constraint" in info.value.body["message"]


def _stream_until(url: str, body: dict, started: threading.Event, stop: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                started.set()
            if stop.is_set():
                return


@requires_real_engine
def test_priority_orders_the_queue_as_in_vllm(url, compat_server):
    """One sequence at a time: while A runs, B (priority 10) queues before C (priority -10); when A
    leaves, C (lower value: earlier, as in vLLM) is served first. B and C ask for three tokens: with one
    request slot and a spare one (EngineConfig.spare_slots), B starts in the step after C's last token is
    launched, so with one token each both answers would leave the engine within a millisecond."""
    started, stop = threading.Event(), threading.Event()
    long_body = {"model": "smol", "messages": USER, "max_tokens": 300, "ignore_eos": True, "temperature": 0}
    holder = threading.Thread(target=_stream_until, args=(url, long_body, started, stop))
    holder.start()
    assert started.wait(60)
    done: dict[str, float] = {}

    def ask(name: str, priority: int) -> None:
        body = {"model": "smol", "messages": USER, "max_tokens": 3, "ignore_eos": True, "priority": priority}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
        done[name] = time.monotonic()

    late = threading.Thread(target=ask, args=("B", 10))
    late.start()
    time.sleep(0.5)
    urgent = threading.Thread(target=ask, args=("C", -10))
    urgent.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _metric(url, "lightspeed:num_requests_waiting") < 2:
        time.sleep(0.2)
    deadline = time.monotonic() + 10  # waiting longer than the 1 s stats interval: a progress line each
    while time.monotonic() < deadline and "no output yet after" not in compat_server.output():
        time.sleep(0.2)
    assert re.search(r"request chatcmpl-\w+: \d+ prompt tokens, no output yet after \d+ s", compat_server.output())
    stop.set()  # A's stream closes: it is aborted and frees the only slot
    for thread in (holder, late, urgent):
        thread.join(120)
    assert set(done) == {"B", "C"} and done["C"] < done["B"]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_log_has_stats_request_and_progress_lines(compat_server, client):
    client.chat.completions.create(model="smol", messages=USER, max_tokens=2, temperature=0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "Engine: prompt" not in compat_server.output():
        time.sleep(0.2)
    log = compat_server.output()
    stats = [line for line in log.splitlines() if "Engine: prompt" in line]
    assert stats and re.search(r"prompt [0-9.]+ tok/s, generation [0-9.]+ tok/s, running \d+, waiting \d+, "
                               r"KV cache [0-9.]+% used \(\d+ cached pages\), prefix cache hit rate", stats[0])
    assert re.search(r"request chatcmpl-\w+: \d+ prompt tokens, max_tokens 2", log)
    assert re.search(r"request chatcmpl-\w+ finished \(length\): 2 tokens, first token after", log)
    assert log.count("--trust-remote-code has no effect here") == 1


def test_idle_kv_cache_counts_cached_pages_as_free(url, client):
    client.chat.completions.create(model="smol", messages=USER, max_tokens=2, temperature=0)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if _metric(url, "lightspeed:kv_cache_usage_perc") == 0.0 and _metric(url, "lightspeed:num_requests_running") == 0:
            break
        time.sleep(0.3)
    assert _metric(url, "lightspeed:kv_cache_usage_perc") == 0.0
    assert _metric(url, "lightspeed:kv_cache_cached_pages") >= 1  # the prompts' pages stay cached
