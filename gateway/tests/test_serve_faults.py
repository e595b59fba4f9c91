"""Fault suite (real server, default model, CPU): a fault in one request fails that request only; the
engine core SIGKILLed mid-stream fails every open stream fast, /health says so, and the supervisor
brings the core back. Each test prints what it tried."""

import asyncio
import json
import os
import re
import signal
import threading
import time

import httpx
import pytest
from gateway_testing import HERE, child_pids, pid_alive, requires_real_engine, start_server, stop_cleanly

POISON_SEED = 666
LONG = {"messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
        "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
SHORT = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12, "temperature": 0}

pytestmark = requires_real_engine


@pytest.fixture(scope="module")
def server():
    path = os.pathsep.join(p for p in (str(HERE / "faults"), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    proc = start_server(["--max-num-seqs", "8", "--engine-restart-backoff-s", "0.2"],
                        env={"PYTHONPATH": path, "LIGHTSPEED_TEST_POISON_SEED": str(POISON_SEED)})
    yield proc
    stop_cleanly(proc)


def _text(body: dict) -> str:
    return body["choices"][0]["message"]["content"]


def test_a_fault_in_one_requests_sampling_state_fails_only_it(server):
    url = server.url
    baseline = _text(httpx.post(url + "/v1/chat/completions", json=SHORT, timeout=120).json())

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            good = [client.post("/v1/chat/completions", json=SHORT) for _ in range(3)]
            bad = client.post("/v1/chat/completions", json={**SHORT, "seed": POISON_SEED, "temperature": 1.0})
            bad_stream = client.post("/v1/chat/completions", json={**SHORT, "seed": POISON_SEED, "stream": True})
            return await asyncio.gather(bad, bad_stream, *good)

    bad, bad_stream, *good = asyncio.run(run())
    for resp in (bad, bad_stream):  # the stream fails before its first token: a status, not an event
        assert resp.status_code == 500, resp.text
        error = resp.json()["error"]
        assert error["code"] == "request_failed" and "Traceback" not in error["message"]
    assert [r.status_code for r in good] == [200] * 3 and all(_text(r.json()) == baseline for r in good)
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    print(f"\nfault suite: 5 requests, 2 with an injected sampling-state fault -> statuses "
          f"{[bad.status_code, bad_stream.status_code] + [r.status_code for r in good]}, engine restarts 0")


def _stream_until_end(url: str, events: list, started: threading.Event, ended: dict, key: int) -> None:
    with httpx.stream("POST", url + "/v1/chat/completions", json=LONG, timeout=120) as resp:
        for line in resp.iter_lines():
            if line:
                events.append(line)
                if len(events) >= 3:
                    started.set()
    ended[key] = time.monotonic()
    started.set()


def test_killed_engine_core_fails_open_streams_and_comes_back(server):
    url = server.url
    core = [p for p in child_pids(server.proc.pid) if pid_alive(p)]
    assert len(core) == 1
    streams, ended, threads = [], {}, []
    for i in range(4):
        events, started = [], threading.Event()
        thread = threading.Thread(target=_stream_until_end, args=(url, events, started, ended, i))
        thread.start()
        streams.append((events, started))
        threads.append(thread)
    for _, started in streams:
        assert started.wait(120)
    os.kill(core[0], signal.SIGKILL)
    killed = time.monotonic()
    health = None
    while time.monotonic() - killed < 2.0:
        health = httpx.get(url + "/health", timeout=5)
        if health.status_code == 503:
            break
        time.sleep(0.05)
    unhealthy_after = time.monotonic() - killed
    assert health.status_code == 503 and health.json() == {"status": "restarting"}, health.text
    assert health.headers["Retry-After"]
    refused = httpx.post(url + "/v1/chat/completions", json=SHORT, timeout=10)
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    for thread in threads:
        thread.join(10)
    latest_end = max(ended.values()) - killed
    for events, _ in streams:
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][6:])["error"]
        assert error["code"] == "engine_dead" and "Traceback" not in error["message"]
    assert latest_end < 2.0, f"streams ended {latest_end:.2f} s after the kill"
    deadline = time.monotonic() + 180
    while httpx.get(url + "/health", timeout=5).status_code != 200:
        assert time.monotonic() < deadline, "the supervisor did not bring the engine back"
        time.sleep(0.2)
    back_after = time.monotonic() - killed
    resp = httpx.post(url + "/v1/chat/completions", json=SHORT, timeout=120)
    assert resp.status_code == 200 and _text(resp.json())
    new_core = [p for p in child_pids(server.proc.pid) if pid_alive(p)]
    assert len(new_core) == 1 and new_core != core and not pid_alive(core[0])
    server.engine_pids = new_core  # stop_cleanly checks that this one goes away with the server
    metrics = httpx.get(url + "/metrics").text
    restarts = re.search(r"^lightspeed:engine_restarts_total\{[^}]*\} ([0-9.]+)$", metrics, re.M)
    assert restarts and float(restarts.group(1)) == 1.0
    print(f"\nfault suite: 4 open streams, engine core SIGKILLed -> streams ended with an error event within "
          f"{latest_end:.2f} s, /health 503 after {unhealthy_after:.2f} s, engine back after {back_after:.1f} s, "
          f"next request 200, restarts 1")
