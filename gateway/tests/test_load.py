"""Load suite (real server, default model, CPU): hundreds of concurrent streams, a fifth of them
cancelled at random points (before their first token, or after a few), in rounds. After each round
every KV page is back (prefix cache off, so free pages must equal the idle total), nothing waits or
runs, the gateway's tasks and in-flight requests are back to idle, and resident memory of the
gateway and engine core stays level from round to round. Each round prints its figures."""

import asyncio
import random
import re
import time
from pathlib import Path

import httpx
import pytest
from gateway_testing import child_pids, requires_real_engine, start_server, stop_cleanly

pytestmark = requires_real_engine
# Tiny requests: the bookkeeping under load is what is tested, and CPU time goes with tokens.
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def server():
    proc = start_server(["--no-enable-prefix-cache", "--host-cache-memory", "0", "--max-num-seqs", "32",
                         "--max-model-len", "256", "--max-waiting-requests", "4096"])
    yield proc
    stop_cleanly(proc)


def gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^lightspeed:(\w+)\{[^}]*\} ([0-9.e+-]+)$", text, re.M)}


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def _idle(url: str, free_pages: float | None, timeout_s: float = 30) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        g = gauges(url)
        quiet = (g.get("num_requests_running") == 0 and g.get("num_requests_waiting") == 0
                 and g.get("gateway_inflight_requests") == 0 and g.get("gateway_waiting_sequences") == 0)
        if quiet and (free_pages is None or g.get("kv_cache_free_pages") == free_pages):
            return g
        assert time.monotonic() < deadline, f"the server did not return to idle: {g}"
        time.sleep(0.1)


async def _one(client: httpx.AsyncClient, i: int, cancel_after: int | None) -> str:
    """'done' (a full stream), 'cancelled' (we left early) or an error description."""
    body = {"prompt": [100 + i % 1000, 42], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True}
    events = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            return f"status {resp.status_code}"
        if cancel_after == 0:
            return "cancelled"
        async for line in resp.aiter_lines():
            if not line:
                continue
            if line == "data: [DONE]":
                return "done" if events >= 1 else "empty"
            if '"error"' in line:
                return f"error event {line[:200]}"
            events += 1
            if cancel_after is not None and events >= cancel_after:
                return "cancelled"
    return "cut"


async def _early_disconnect(client: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    """Leave while the request still waits for its first token (or is being admitted)."""
    task = asyncio.ensure_future(_one(client, i, None))
    await asyncio.sleep(rng.uniform(0.0, 0.5))
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return "cancelled"


async def _round(url: str, num_streams: int, rng: random.Random) -> dict[str, int]:
    cancelled = set(rng.sample(range(num_streams), num_streams // 5))
    limits = httpx.Limits(max_connections=num_streams + 10, max_keepalive_connections=num_streams + 10)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        jobs = []
        for i in range(num_streams):
            if i not in cancelled:
                jobs.append(_one(client, i, None))
            elif i % 2:
                jobs.append(_early_disconnect(client, i, rng))
            else:
                jobs.append(_one(client, i, rng.randint(1, MAX_TOKENS - 1)))
        results = await asyncio.gather(*jobs)
    counts: dict[str, int] = {}
    for r in results:
        counts[r] = counts.get(r, 0) + 1
    return counts


def _load_rounds(server, rounds: list[int]) -> None:
    url = server.url
    idle = _idle(url, None)
    free_pages, tasks_idle = idle["kv_cache_free_pages"], idle["gateway_tasks"]
    gateway_pid = server.proc.pid
    core_pid = child_pids(gateway_pid)[0]
    rng = random.Random(11)
    rss = []
    for number, num_streams in enumerate(rounds, start=1):
        started = time.monotonic()
        counts = asyncio.run(_round(url, num_streams, rng))
        took = time.monotonic() - started
        after = _idle(url, free_pages)
        rss.append((rss_mib(gateway_pid), rss_mib(core_pid)))
        print(f"\nload round {number}: {num_streams} concurrent streams ({num_streams // 5} cancelled at random "
              f"points) in {took:.1f} s -> {counts}; pages lost {free_pages - after['kv_cache_free_pages']:.0f} "
              f"of {free_pages:.0f}; gateway tasks {after['gateway_tasks']:.0f} (idle {tasks_idle:.0f}); "
              f"RSS gateway {rss[-1][0]:.0f} MiB, engine core {rss[-1][1]:.0f} MiB")
        assert set(counts) <= {"done", "cancelled"}, counts
        assert counts.get("done", 0) >= num_streams - num_streams // 5
        assert after["gateway_tasks"] <= tasks_idle + 2
    if len(rss) >= 3:  # level after the first round (which warms caches and allocators up)
        for before, last in zip(rss[1], rss[-1], strict=True):
            assert last <= before * 1.05 + 16, f"resident memory grew: {rss}"


def test_concurrent_streams_with_random_cancels_lose_nothing(server):
    _load_rounds(server, [500, 100, 100])


@pytest.mark.slow
def test_load_soak(server):
    _load_rounds(server, [500] * 6)
