"""Fault suite of data-parallel cores that step alone (a dense model, `lightspeed serve -dp 2`): one
core SIGKILLed mid-stream fails only its own streams; the other core's streams finish with the
tokens they give alone, new requests succeed while the dead core restarts (/health ok, naming it),
and the supervisor brings back that core only, which then serves again. Cores that step together
(one world) keep restarting together: test_supervisor_parallel.py."""

import json
import os
import re
import signal
import threading
import time

import httpx
import pytest
from gateway_testing import HERE, child_pids, pid_alive, requires_real_engine, start_server, stop_cleanly

pytestmark = requires_real_engine

PROMPTS = [f"{i}: Once upon a time, in a village by the sea," for i in ("One", "Two", "Three", "Four")]
STREAM = {"max_tokens": 64, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    hold = tmp_path_factory.mktemp("dp-faults") / "hold-core-start"
    path = os.pathsep.join(p for p in (str(HERE / "faults"), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    proc = start_server(["--data-parallel-size", "2", "--engine-restart-backoff-s", "0.2",
                         "--health-check-interval-s", "0.1"],
                        env={"PYTHONPATH": path, "LIGHTSPEED_TEST_HOLD_CORE_START": str(hold)})
    proc.hold = hold
    yield proc
    proc.hold.unlink(missing_ok=True)
    stop_cleanly(proc)


def _complete(url: str, prompt: str, **extra) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"prompt": prompt, **STREAM, **extra}, timeout=120)


def _stream(url: str, prompt: str, events: list, started: threading.Event, ended: list) -> None:
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": prompt, **STREAM, "stream": True},
                      timeout=120) as resp:
        for line in resp.iter_lines():
            if line:
                events.append(line)
                if len(events) >= 3:
                    started.set()
    ended.append(time.monotonic())
    started.set()


def _routed(url: str) -> dict[str, float]:
    return {engine: float(value) for engine, value in re.findall(
        r'^lightspeed:data_parallel_routed_requests_total\{engine="(\d)",[^}]*\} (\S+)$',
        httpx.get(url + "/metrics").text, re.M)}


def _text(events: list[str]) -> str:
    return "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1] if '"choices"' in e)


def test_a_killed_core_costs_its_own_streams_only(server):
    url = server.url
    cores = [p for p in child_pids(server.proc.pid) if pid_alive(p)]
    assert len(cores) == 2 and httpx.get(url + "/health").json() == {"status": "ok", "engines": ["ok", "ok"]}
    alone = [_complete(url, p).json()["choices"][0]["text"] for p in PROMPTS]
    streams, threads = [], []
    for prompt in PROMPTS:  # distinct first pages: the router spreads them, two per core
        events, started, ended = [], threading.Event(), []
        threads.append(threading.Thread(target=_stream, args=(url, prompt, events, started, ended)))
        threads[-1].start()
        streams.append((events, started, ended))
    for _, started, _ in streams:
        assert started.wait(120)
    server.hold.touch()  # the killed core's replacement waits at start-up until the test lets it go
    os.kill(cores[1], signal.SIGKILL)
    killed = time.monotonic()
    for thread in threads:
        thread.join(60)
    assert all(events[-1] == "data: [DONE]" for events, _, _ in streams), [e[-2:] for e, _, _ in streams]
    errors = [json.loads(events[-2][6:]).get("error") for events, _, _ in streams]
    assert sorted(e["code"] if e else "finished" for e in errors) == ["engine_dead", "engine_dead", "finished",
                                                                     "finished"], [e[-2:] for e, _, _ in streams]
    for (events, _, ended), text, error in zip(streams, alone, errors, strict=True):
        if error:  # the dead core's streams end at once
            assert ended[0] - killed < 2.0, f"a stream of the dead core ended {ended[0] - killed:.2f} s after the kill"
        else:  # the other core's streams: every token, as alone
            assert _text(events) == text
    health = httpx.get(url + "/health")
    assert health.status_code == 200 and sorted(health.json()["engines"]) == ["ok", "restarting"], health.text
    dead = health.json()["engines"].index("restarting")
    during = [_complete(url, f"{i} Tell me about lighthouses.", max_tokens=4) for i in range(3)]
    assert [r.status_code for r in during] == [200] * 3  # the live core serves while the other is down
    assert httpx.get(url + "/health").json()["engines"][dead] == "restarting"
    server.hold.unlink()
    deadline = time.monotonic() + 180
    while httpx.get(url + "/health").json()["engines"] != ["ok", "ok"]:
        assert time.monotonic() < deadline, "the supervisor did not bring the core back"
        time.sleep(0.1)
    back_after = time.monotonic() - killed
    new = [p for p in child_pids(server.proc.pid) if pid_alive(p)]
    assert cores[0] in new and cores[1] not in new and len(new) == 2  # only the killed core restarted
    server.engine_pids = new
    before = _routed(url)
    after_ok = [_complete(url, f"{i} Name a colour.", max_tokens=4).status_code for i in range(4)]
    routed = _routed(url)
    assert after_ok == [200] * 4 and routed[str(dead)] > before[str(dead)]  # the restarted core serves again
    restarts = re.search(r"^lightspeed:engine_restarts_total\{[^}]*\} ([0-9.]+)$", httpx.get(url + "/metrics").text,
                         re.M)
    assert restarts and float(restarts.group(1)) == 1.0
    print(f"\nDP 2 fault suite: 4 streams, core {dead} SIGKILLed -> its 2 streams ended with engine_dead, the other "
          f"2 complete as alone; 3 requests 200 while it was held down; "
          f"back {back_after:.1f} s after the kill (hold included), restarts 1")
