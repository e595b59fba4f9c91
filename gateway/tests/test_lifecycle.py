"""Client disconnect aborts the request in the engine at once; engine death fails fast and loudly."""

import json
import os
import re
import signal
import threading
import time

import httpx
import pytest
from gateway_testing import pid_alive, start_server, stop_cleanly

LONG = {"messages": [{"role": "user", "content": "Write a very long story about a lighthouse."}],
        "max_tokens": 400, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    # No prefix cache: every page a request takes must come back when it ends.
    proc = start_server(["--no-enable-prefix-cache", "--max-num-seqs", "2"])
    yield proc
    stop_cleanly(proc)


def gauges(url) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    out = {}
    for name in ("num_requests_running", "kv_cache_free_pages", "engine_steps_total"):
        match = re.search(rf"^lightspeed:{name}{{[^}}]*}} ([0-9.e+-]+)$", text, re.M)
        if match:
            out[name] = float(match.group(1))
    return out


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    return predicate()


def idle_gauges(url) -> dict[str, float]:
    idle = wait_for(lambda: (g := gauges(url)).get("num_requests_running") == 0 and "kv_cache_free_pages" in g
                    and g, 10)
    assert idle, gauges(url)
    return idle


def test_stream_disconnect_returns_pages(server):
    url = server.url
    free_before = idle_gauges(url)["kv_cache_free_pages"]
    with httpx.stream("POST", url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=120) as resp:
        lines = resp.iter_lines()
        for _ in range(6):  # a few tokens in: the request holds pages
            next(lines)
        busy = wait_for(lambda: (g := gauges(url)).get("num_requests_running") == 1 and g, 10)
        assert busy and busy["kv_cache_free_pages"] < free_before
        disconnected = time.monotonic()
    # Closing the stream closed the connection: the engine must drop the request now, not after 400 tokens.
    after = wait_for(lambda: (g := gauges(url)).get("num_requests_running") == 0
                     and g["kv_cache_free_pages"] == free_before and g, 5)
    assert after, gauges(url)
    assert time.monotonic() - disconnected < 5


def test_non_streaming_disconnect_aborts(server):
    url = server.url
    free_before = idle_gauges(url)["kv_cache_free_pages"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/chat/completions", json=LONG, timeout=3)  # give up waiting: disconnect
    after = wait_for(lambda: (g := gauges(url)).get("num_requests_running") == 0
                     and g["kv_cache_free_pages"] == free_before and g, 5)
    assert after, gauges(url)


def test_engine_death_fails_requests_and_health(server):
    url = server.url
    assert server.engine_pids and httpx.get(url + "/health").status_code == 200
    events: list[str] = []
    started = threading.Event()

    def stream():
        with httpx.stream("POST", url + "/v1/chat/completions", json={**LONG, "stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    events.append(line)
                    started.set()
        started.set()

    worker = threading.Thread(target=stream)
    worker.start()
    assert started.wait(60)
    os.kill(server.engine_pids[0], signal.SIGKILL)
    killed = time.monotonic()
    unhealthy = wait_for(lambda: httpx.get(url + "/health").status_code == 503, 2.0, 0.05)
    assert unhealthy and time.monotonic() - killed <= 2.5
    worker.join(10)
    assert not worker.is_alive(), "the in-flight stream must end, not hang"
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert error["code"] == "engine_dead"
    started_new = time.monotonic()
    resp = httpx.post(url + "/v1/chat/completions", json={**LONG, "max_tokens": 2}, timeout=10)
    assert resp.status_code == 503 and resp.headers["Retry-After"]
    assert resp.json()["error"]["type"] == "service_unavailable"
    assert time.monotonic() - started_new < 2
    assert not pid_alive(server.engine_pids[0])
