"""Abuse suite (real server, default model, CPU): every fan-out and per-request limit answers a 400
naming the field and the flag; oversized and malformed bodies are 4xx; the API key can guard every
route but /health; no information about the machine leaks; nothing reaches a 5xx, and the server
serves a normal request afterwards. Prints what it sent."""

import collections
import json

import httpx
import pytest
from gateway_testing import requires_real_engine, start_server, stop_cleanly

KEY = "abuse-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_LIMIT = 64 * 1024
CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
STATUSES: collections.Counter = collections.Counter()

pytestmark = requires_real_engine


@pytest.fixture(scope="module")
def url():
    proc = start_server(["--api-key", KEY, "--api-key-scope", "all", "--max-request-body-bytes", str(BODY_LIMIT),
                         "--max-num-prompts", "4", "--max-n", "4", "--max-sequences-per-request", "8",
                         "--max-stop-sequences", "2", "--max-num-tools", "2", "--max-tokens-per-request", "8",
                         "--max-logit-bias", "3", "--max-stop-token-ids", "2"])
    yield proc.url
    output = proc.output()
    stop_cleanly(proc)
    assert "Exception in ASGI application" not in output
    print(f"\nabuse suite: {sum(STATUSES.values())} requests -> statuses {dict(sorted(STATUSES.items()))}; "
          f"server errors {sum(n for s, n in STATUSES.items() if s >= 500)}")


def send(url, method, path, body=None, headers=AUTH, **kw):
    if body is not None and "content" not in kw:
        kw["json"] = body
    resp = httpx.request(method, url + path, headers=headers, timeout=120, **kw)
    STATUSES[resp.status_code] += 1
    assert resp.status_code < 500, resp.text
    return resp


def assert_400(resp, param=None, mentions=None):
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    if mentions is not None:
        assert mentions in error["message"], error
    return error


LIMITS = [
    ("/v1/completions", {"prompt": ["a", "b", "c", "d", "e"], "max_tokens": 1}, "prompt", "--max-num-prompts"),
    ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1}, "n", "--max-sequences-per-request"),
    ("/v1/chat/completions", {**CHAT, "n": 5}, "n", "--max-n"),
    ("/v1/chat/completions", {**CHAT, "stop": ["x", "y", "z"]}, "stop", "--max-stop-sequences"),
    ("/v1/completions", {"prompt": "x", "stop": ["x", "y", "z"]}, "stop", "--max-stop-sequences"),
    ("/v1/chat/completions", {**CHAT, "stop_token_ids": [1, 2, 3]}, "stop_token_ids", "--max-stop-token-ids"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"1": 1, "2": 1, "3": 1, "4": 1}}, "logit_bias",
     "--max-logit-bias"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL] * 3}, "tools", "--max-num-tools"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 9}, "max_tokens", "--max-tokens-per-request"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 9}, "max_completion_tokens",
     "--max-tokens-per-request"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 9}, "max_tokens", "--max-tokens-per-request"),
    ("/tokenize", {"messages": CHAT["messages"], "tools": [TOOL] * 3}, "tools", "--max-num-tools"),
]


@pytest.mark.parametrize("path,body,param,flag", LIMITS, ids=[f"{p}-{f}" for p, _, _, f in LIMITS])
def test_each_limit_is_a_400_naming_it(url, path, body, param, flag):
    assert_400(send(url, "POST", path, body), param, flag)


def test_requests_at_the_limits_are_served(url):
    at_limit = [
        ("/v1/completions", {"prompt": ["a", "b"], "n": 4, "max_tokens": 2, "stop": ["x", "y"],
                             "stop_token_ids": [1, 2], "logit_bias": {"5": 1, "6": -1, "7": 2}}),
        ("/v1/chat/completions", {**CHAT, "tools": [TOOL] * 2, "n": 4, "max_tokens": 8}),
    ]
    for path, body in at_limit:
        resp = send(url, "POST", path, body)
        assert resp.status_code == 200 and len(resp.json()["choices"]) in (4, 8), resp.text
    # Unset max_tokens is capped by --max-tokens-per-request, not refused.
    resp = send(url, "POST", "/v1/chat/completions", {"messages": CHAT["messages"], "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] <= 8


MALFORMED = {
    "not json": b"{not json",
    "empty": b"",
    "array": b"[1, 2, 3]",
    "string": b'"hello"',
    "deeply nested": b"[" * 20000 + b"]" * 20000,
    "nested messages": json.dumps({"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"schema": json.loads('{"a": ' * 500 + "1" + "}" * 500)}}}).encode(),
    "huge number": b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1' + b"0" * 400 + b"}",
    "NaN": b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    "invalid utf-8": b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
    "lone surrogate": b'{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}',
    "nul": b'{"messages": [{"role": "user", "content": "a\\u0000b"}], "max_tokens": 1}',
    "wrong types": b'{"messages": [{"role": 5, "content": {"x": 1}}]}',
    "negative token ids": b'{"prompt": [-1, 5], "max_tokens": 1}',
    "huge token ids": b'{"prompt": [1099511627776], "max_tokens": 1}',
    "empty token list": b'{"prompt": [[]], "max_tokens": 1}',
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_bodies_are_client_errors(url, name):
    path = "/v1/completions" if b'"prompt"' in MALFORMED[name] else "/v1/chat/completions"
    for content_type in ("application/json", "text/plain"):
        resp = send(url, "POST", path, content=MALFORMED[name], headers={**AUTH, "content-type": content_type})
        assert resp.status_code in (200, 400, 413, 422), resp.text  # 200: a body that is valid after all
        if resp.status_code != 200:
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_oversized_bodies_are_413(url):
    big = {"messages": [{"role": "user", "content": "x" * BODY_LIMIT}]}
    assert send(url, "POST", "/v1/chat/completions", big).status_code == 413

    def chunks():
        for _ in range(8):
            yield b" " * (BODY_LIMIT // 4)
    resp = send(url, "POST", "/v1/completions", content=chunks(), headers={**AUTH, "content-type": "application/json"})
    assert resp.status_code == 413


def test_api_key_scope_all_guards_everything_but_health(url):
    for method, path, body in (("POST", "/tokenize", {"prompt": "hi"}), ("POST", "/detokenize", {"tokens": [1]}),
                               ("GET", "/metrics", None), ("GET", "/version", None), ("GET", "/v1/models", None)):
        assert send(url, method, path, body, headers={}).status_code == 401
        assert send(url, method, path, body).status_code == 200
    assert send(url, "GET", "/health", headers={}).json() == {"status": "ok"}


def test_nothing_about_the_machine_is_served(url):
    models = send(url, "GET", "/v1/models").json()["data"]
    assert all("/" not in (card.get("root") or "") for card in models), models
    health = send(url, "GET", "/health", headers={})
    assert health.json() == {"status": "ok"}


def test_still_serving_after_all_of_it(url):
    resp = send(url, "POST", "/v1/chat/completions", CHAT)
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] is not None
