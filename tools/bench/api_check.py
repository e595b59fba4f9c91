#!/usr/bin/env python
"""Check a running server's OpenAI-compatible API end to end: chat (plain and streamed), a forced tool
call, structured output against a JSON schema, completions, and bad input answered with a clear error
while the server keeps serving. Works with random (dummy) weights: the structural checks hold whatever
the model says, because tool calls and schemas are grammar-constrained (with bounded values and the
engine's bound on whitespace between JSON elements, a random model closes the object too).

    python tools/bench/api_check.py --base-url http://127.0.0.1:8000 [--out OUT/api_check.json]

Prints one line per check; exits with the number of failed checks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import httpx

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
# Bounded values (string lengths, integer ranges, enums), so random weights can close the object too.
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0,
                                                                             "maximum": 120},
                         "city": {"enum": ["Paris", "Oslo", "Lima"]}}}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def sse_events(response: httpx.Response) -> list:
    """The JSON payloads of a server-sent event stream, and "[DONE]" where it ends."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def check_models(c, model):
    ids = [m["id"] for m in c.get("/v1/models").raise_for_status().json()["data"]]
    assert model in ids, ids


def check_chat(c, model):
    r = c.post("/v1/chat/completions", json={"model": model, "messages": ASK, "max_tokens": 16}).raise_for_status().json()
    choice = r["choices"][0]
    assert isinstance(choice["message"]["content"], str) and choice["finish_reason"] in ("stop", "length"), choice
    assert r["usage"]["completion_tokens"] >= 1 and r["usage"]["prompt_tokens"] > 0, r["usage"]


def check_chat_stream(c, model):
    body = {"model": model, "messages": ASK, "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True}}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        events = sse_events(r)
    assert events and events[-1] == "[DONE]", events[-3:]
    chunks = events[:-1]
    finish = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"] and ch["choices"][0].get("finish_reason")]
    usage = [ch["usage"] for ch in chunks if ch.get("usage")]
    assert finish and finish[-1] in ("stop", "length"), finish
    assert usage and usage[-1]["completion_tokens"] >= 1, usage


def check_forced_tool_call(c, model):
    body = {"model": model, "messages": ASK, "max_tokens": 48, "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    r = c.post("/v1/chat/completions", json=body).raise_for_status().json()
    calls = r["choices"][0]["message"].get("tool_calls") or []
    assert calls and calls[0]["function"]["name"] == "get_weather", r["choices"][0]
    args = json.loads(calls[0]["function"]["arguments"])
    assert isinstance(args.get("city"), str), args


# Enough tokens for a random model to close a required-mode call array whatever it picks: about 14
# places between the array's JSON tokens, each allowing up to 16 whitespace characters (the engine's
# bound), plus the 12-character city and the structure. 48 was not: the H200 DeepSeek run spent them
# on whitespace (bench/results/deepseek_serve_2026-12-02_1405_h200). A real model stops far earlier.
REQUIRED_CALL_BUDGET = 288


def check_required_tool_call(c, model):
    body = {"model": model, "messages": ASK, "max_tokens": REQUIRED_CALL_BUDGET, "tools": [WEATHER],
            "tool_choice": "required"}
    r = c.post("/v1/chat/completions", json=body).raise_for_status().json()
    choice = r["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    if choice["finish_reason"] == "length":  # a random model may not close the array within the budget
        raise AssertionError(f"ran out of tokens before the calls closed: {choice['message']!r}")
    assert calls and all(call["function"]["name"] == "get_weather" for call in calls), choice
    for call in calls:
        json.loads(call["function"]["arguments"])


def check_json_schema(c, model):
    import jsonschema

    body = {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": "Describe a person as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}}
    r = c.post("/v1/chat/completions", json=body).raise_for_status().json()
    choice = r["choices"][0]
    if choice["finish_reason"] == "length":  # a random model may not close the object within the budget
        raise AssertionError(f"ran out of tokens before the object closed: {choice['message']['content']!r}")
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def check_completions(c, model):
    r = c.post("/v1/completions", json={"model": model, "prompt": "def add(a, b):", "max_tokens": 8}).raise_for_status().json()
    assert isinstance(r["choices"][0]["text"], str) and r["usage"]["completion_tokens"] >= 1, r


def check_bad_input_keeps_serving(c, model):
    cases = [({"model": "no-such-model", "messages": ASK}, (400, 404)),
             ({"model": model, "messages": ASK, "max_tokens": -1}, (400, 422)),
             ({"model": model, "messages": "not a list"}, (400, 422))]
    for body, codes in cases:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code in codes, (body, r.status_code, r.text[:200])
        assert "error" in r.json() or "detail" in r.json(), r.text[:200]
    check_chat(c, model)  # and the next good request is served


CHECKS = [check_models, check_chat, check_chat_stream, check_forced_tool_call, check_required_tool_call,
          check_json_schema, check_completions, check_bad_input_keeps_serving]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="default: the first of /v1/models")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    with httpx.Client(base_url=args.base_url, timeout=args.timeout) as c:
        try:
            model = args.model or c.get("/v1/models").raise_for_status().json()["data"][0]["id"]
        except httpx.HTTPError as e:
            print(f"cannot list the models at {args.base_url}: {type(e).__name__}: {e}", file=sys.stderr)
            return len(CHECKS)
        results = []
        for check in CHECKS:
            t0 = time.perf_counter()
            try:
                check(c, model)
                ok, detail = True, ""
            except Exception as e:  # every check reports; one failure does not hide the rest
                ok, detail = False, f"{type(e).__name__}: {str(e)[:300]}"
            results.append({"check": check.__name__[len("check_"):], "ok": ok, "seconds": time.perf_counter() - t0,
                            "detail": detail})
            print(f"{'ok  ' if ok else 'FAIL'} {results[-1]['check']:28s} {results[-1]['seconds']:6.2f} s {detail}", flush=True)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} of {len(results)} checks passed against {model} at {args.base_url}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"base_url": args.base_url, "model": model, "results": results}, f, indent=1)
    return failed


if __name__ == "__main__":
    sys.exit(main())
