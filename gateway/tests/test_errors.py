"""OpenAI-shaped errors and their status codes; a bad request never disturbs the others."""

import threading
import time

import httpx
import pytest
from gateway_testing import requires_real_engine, start_server, stop_cleanly

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 8192
OK_CHAT = {"messages": [{"role": "user", "content": "SAY:fine thanks"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def url():
    proc = start_server(["--api-key", KEY, "--max-request-body-bytes", str(LIMIT), "--max-waiting-requests", "1",
                         "--max-num-seqs", "1", "--retry-after-s", "2"])
    yield proc.url
    stop_cleanly(proc)


def post(url, path, body=None, headers=AUTH, **kw):
    return httpx.post(url + path, json=body, headers=headers, timeout=120, **kw)


def assert_error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_auth_on_every_v1_route(url):
    routes = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", OK_CHAT),
              ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})]
    for method, path, body in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": f"Bearer {KEY}x"}):
            resp = httpx.request(method, url + path, json=body, headers=headers)
            assert assert_error(resp, 401)["type"] == "authentication_error"
        assert httpx.request(method, url + path, json=body, headers=AUTH, timeout=120).status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/metrics").status_code == 200


def test_anthropic_routes_take_x_api_key_and_answer_in_their_shape(url):
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "SAY:ok"}], "model": None}
    body["model"] = httpx.get(url + "/v1/models", headers=AUTH).json()["data"][0]["id"]
    for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": f"Bearer {KEY}x"}):
        resp = httpx.post(url + "/v1/messages", json=body, headers=headers)
        assert resp.status_code == 401
        assert resp.json() == {"type": "error", "error": {"type": "authentication_error",
                                                          "message": "Invalid or missing API key."}}
    for headers in ({"x-api-key": KEY}, AUTH):
        assert httpx.post(url + "/v1/messages", json=body, headers=headers, timeout=120).status_code == 200
    assert httpx.get(url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
    big = {**body, "messages": [{"role": "user", "content": "x" * (LIMIT + 10)}]}
    resp = httpx.post(url + "/v1/messages", json=big, headers={"x-api-key": KEY})
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "request_too_large"


def test_invalid_json_and_wrong_types(url):
    resp = httpx.post(url + "/v1/chat/completions", content=b"{not json", headers={**AUTH, "content-type":
                                                                                    "application/json"})
    error = assert_error(resp, 400)
    assert error["param"] is None and error["message"].startswith("The request body is not valid JSON")
    assert_error(post(url, "/v1/chat/completions", {"messages": "hello"}), 400, "messages")
    assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, "max_tokens": "many"}), 400, "max_tokens")
    assert_error(post(url, "/v1/chat/completions", {"messages": []}), 400, "messages")


@pytest.mark.parametrize("field,value", [("temperature", 2.5), ("top_p", 0), ("n", 0), ("max_tokens", 0),
                                         ("presence_penalty", 3), ("frequency_penalty", -2.5), ("top_k", -2),
                                         ("logit_bias", {"5": 101}), ("logit_bias", {"99999999": 1}),
                                         ("stop_token_ids", [10**9]), ("min_p", 1.5), ("seed", "x")])
def test_out_of_range(url, field, value):
    assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, field: value}), 400)


def test_unknown_fields_rejected(url):
    error = assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, "frobnicate": 1}), 400, "frobnicate")
    assert "frobnicate" in error["message"] and "did you mean" not in error["message"]
    assert_error(post(url, "/v1/completions", {"prompt": "x", "bogus": True}), 400)


def test_messages_carry_no_pydantic_prefixes(url):
    error = assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, "top_logprobs": 2}), 400)
    assert error["message"] == "top_logprobs requires logprobs=true"


def test_context_length(url):
    long_prompt = "word " * 1100
    assert_error(post(url, "/v1/completions", {"prompt": long_prompt, "max_tokens": 1}), 400, "prompt")
    assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, "max_tokens": 1020}), 400, "max_tokens")
    assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, "max_completion_tokens": 1020}), 400,
                 "max_completion_tokens")
    chat = {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 1}
    assert_error(post(url, "/v1/chat/completions", chat), 400, "messages")


def test_unknown_model_is_404(url):
    for path, body in (("/v1/chat/completions", OK_CHAT), ("/v1/completions", {"prompt": "x"})):
        error = assert_error(post(url, path, {**body, "model": "gpt-9"}), 404, "model")
        assert error["code"] == "model_not_found"


def test_body_over_limit_is_413(url):
    big = {**OK_CHAT, "messages": [{"role": "user", "content": "x" * (LIMIT + 10)}]}
    assert_error(post(url, "/v1/chat/completions", big), 413)

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(4):
            yield b" " * (LIMIT // 2)
    resp = httpx.post(url + "/v1/chat/completions", content=chunks(), headers={**AUTH, "content-type":
                                                                                "application/json"})
    assert_error(resp, 413)


def test_unknown_route_is_openai_shaped(url):
    assert_error(httpx.get(url + "/v1/nothing", headers=AUTH), 404)


def _stream(url, body, out, key, started=None, stop=None):
    """Stream a chat completion; set `started` at the first event, leave early when `stop` is set."""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=AUTH,
                      timeout=120) as resp:
        out[key + "_status"] = resp.status_code
        out[key] = []
        for line in resp.iter_lines():
            if line:
                out[key].append(line)
                if started is not None and len(out[key]) >= 2:
                    started.set()
                if stop is not None and stop.is_set():
                    return


def test_waiting_queue_bound_gives_429_with_retry_after(url):
    long_body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
                 "temperature": 0, "ignore_eos": True}
    results: dict = {}
    started, stop = threading.Event(), threading.Event()
    first = threading.Thread(target=_stream, args=(url, long_body, results, "a", started, stop))
    first.start()
    assert started.wait(60)  # A is decoding and holds the only sequence slot (max_num_seqs=1) ...
    second = threading.Thread(target=_stream, args=(url, {**long_body, "max_tokens": 4}, results, "b"))
    second.start()
    time.sleep(1.0)  # ... so B waits for its first token, filling the waiting bound (1)
    resp = post(url, "/v1/chat/completions", OK_CHAT)
    error = assert_error(resp, 429)
    assert resp.headers["Retry-After"] == "2" and error["type"] == "rate_limit_error"
    stop.set()  # A leaves (its request is aborted), B gets the slot and finishes
    first.join()
    second.join(60)
    assert results["a_status"] == results["b_status"] == 200
    assert results["b"][-1] == "data: [DONE]"
    assert post(url, "/v1/chat/completions", OK_CHAT).status_code == 200


def test_bad_requests_do_not_disturb_a_running_stream(url):
    body = {"messages": [{"role": "user", "content": "SAY:one two three four five six"}], "max_tokens": 20,
            "temperature": 0}
    baseline = post(url, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"]
    results: dict = {}
    worker = threading.Thread(target=_stream, args=(url, body, results, "s"))
    worker.start()
    bad = [{"messages": 5}, {**body, "temperature": -1}, {**body, "model": "nope"}, {**body, "n": 1000}]
    for payload in bad * 3:
        assert post(url, "/v1/chat/completions", payload).status_code in (400, 404)
    worker.join()
    import json

    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                   for line in results["s"][:-1] if json.loads(line[6:])["choices"])
    assert text == baseline


@requires_real_engine
def test_edge_values_never_reach_the_core_as_poison(url):
    # uint64 seeds (OpenAI allows them) with n=2 once overflowed the core's int64 seed table and killed it.
    resp = post(url, "/v1/chat/completions", {**OK_CHAT, "seed": 2**64 - 1, "n": 2, "temperature": 1})
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 2
    assert post(url, "/v1/chat/completions", {**OK_CHAT, "seed": -(2**63)}).status_code == 200
    # A top_k above the vocabulary (found by schemathesis) crashed the core's sampler.
    assert post(url, "/v1/chat/completions", {**OK_CHAT, "top_k": 15716214824, "temperature": 1}).status_code == 200
    bad_schema = {**OK_CHAT, "response_format": {"type": "json_schema",
                                                 "json_schema": {"name": "x", "schema": {"type": "foo"}}}}
    error = assert_error(post(url, "/v1/chat/completions", bad_schema), 400)
    assert "foo" in error["message"] and ".cc:" not in error["message"] and "/" not in error["message"]
    assert_error(post(url, "/v1/chat/completions", {**OK_CHAT, "stream": True, **bad_schema}), 400)
    assert httpx.get(url + "/health").status_code == 200
