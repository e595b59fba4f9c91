"""`lightspeed serve --disk-cache-dir`: a conversation's second turn, after a server restart, is
served its first turn from the disk tier, and usage reports it per tier."""

import time

import httpx
import openai
from gateway_testing import requires_real_engine, start_server, stop_cleanly

PAGE = 16
FIRST = [{"role": "system", "content": "You are a careful assistant who answers in one line. " * 10},
         {"role": "user", "content": "SAY:The capital of France is Paris. It is a big city."}]


def chat(url: str, messages: list[dict], **extra):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=12, **extra)


@requires_real_engine
def test_second_turn_after_a_restart_is_served_from_disk(tmp_path):
    args = ["--disk-cache-dir", str(tmp_path), "--disk-cache-size", "256MiB"]
    server = start_server(args)
    try:
        first = chat(server.url, FIRST)
        details = first.usage.prompt_tokens_details
        assert details.cached_tokens == 0
        assert details.model_extra["cached_tokens_by_tier"] == {"device": 0, "host": 0, "disk": 0}
    finally:
        stop_cleanly(server)
    server = start_server(args)
    try:
        second = FIRST + [{"role": "assistant", "content": first.choices[0].message.content},
                          {"role": "user", "content": "SAY:And what about Spain?"}]
        chunks = list(chat(server.url, second, stream=True, stream_options={"include_usage": True}))
        usage = chunks[-1].usage
        covered = first.usage.prompt_tokens // PAGE * PAGE
        assert usage.prompt_tokens_details.cached_tokens >= covered, "the first turn is served, not recomputed"
        by_tier = usage.prompt_tokens_details.model_extra["cached_tokens_by_tier"]
        assert by_tier == {"device": 0, "host": 0, "disk": usage.prompt_tokens_details.cached_tokens}
        assert _disk_hit_tokens_metric(server.url, covered) >= covered
    finally:
        stop_cleanly(server)


def _disk_hit_tokens_metric(url: str, at_least: float, timeout_s: float = 10.0) -> float:
    """The disk tier's hit-token counter on /metrics once it reaches `at_least`, else its last value
    after timeout_s: the core's stats snapshots come every 50 ms while busy and about every second
    when idle, so the one that shows the last request may come after its response."""
    deadline, value = time.monotonic() + timeout_s, -1.0
    while time.monotonic() < deadline:
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith("lightspeed:prefix_cache_hit_tokens_by_tier_total{") and 'tier="disk"' in line:
                value = float(line.rsplit(" ", 1)[1])
        if value >= at_least:
            return value
        time.sleep(0.2)
    return value
