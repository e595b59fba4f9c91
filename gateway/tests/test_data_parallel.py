"""Data-parallel engine cores behind the cache-aware router: unit tests of the router, and
`lightspeed serve --data-parallel-size 2` sending each conversation's second turn to the core that
served its first (cached_tokens shows it), with per-core series on /metrics."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from gateway_testing import ENGINE_KIND, start_server, stop_cleanly
from lightspeed_gateway.server.data_parallel import CacheAwareRouter, PrefixIndex

PAGE = 4


def test_prefix_index_matches_whole_leading_pages_only():
    index = PrefixIndex(2, PAGE, capacity_pages=100)
    seq = list(range(10))  # two full pages and a partial one
    keys = index.keys(seq)
    assert len(keys) == 2 and index.keys(seq[:8]) == keys and index.keys(seq[:3]) == []
    index.insert(1, keys)
    assert index.matched_pages(index.keys(seq + [77] * 8)) == [0, 2]
    other = [99] + seq[1:]  # a different first token changes every chained key
    assert index.matched_pages(index.keys(other)) == [0, 0]
    small = PrefixIndex(1, PAGE, capacity_pages=2)
    small.insert(0, index.keys(list(range(100, 112))))  # 3 pages, room for 2: the oldest goes
    assert small.matched_pages(index.keys(list(range(100, 112)))) == [0]


def test_router_prefers_the_longest_prefix_then_the_least_loaded():
    router = CacheAwareRouter(3, PAGE, 1000, balance_abs=2, balance_rel=1.5)
    keys = router.index.keys(list(range(16)))
    router.index.insert(2, keys[:2])
    router.index.insert(1, keys)
    assert router.route(keys, [0, 0, 0]) == 1  # all 4 pages cached there
    assert router.route(keys, [0, 1, 0]) == 1  # a little busier: the cache still wins
    assert router.route(keys, [0, 5, 0]) == 2  # overloaded: the next longest prefix
    assert router.route(router.index.keys([500] * 8), [3, 0, 2]) == 1  # nothing cached: least loaded
    # A conversation id sticks to its core before any page of it is cached.
    first = router.route([], [0, 0, 0], session_id="s")
    assert router.route([], [0, 0, 0], session_id="s") == first


def test_router_sends_nothing_to_a_core_that_is_down():
    router = CacheAwareRouter(3, PAGE, 1000)
    keys = router.index.keys(list(range(16)))
    router.index.insert(1, keys)
    stuck = router.route([], [0, 0, 0], session_id="s")
    live = [r for r in range(3) if r not in (1, stuck)]  # core 1 (longest prefix) and the conversation's are down
    for _ in range(6):
        assert router.route(keys, [0, 0, 0], live=live) in live
    assert router.route([], [0, 0, 0], session_id="s", live=live) in live
    router.index.forget(1)  # core 1 restarted with an empty cache
    assert router.index.matched_pages(keys) == [0, 0, 0]


@pytest.mark.skipif(ENGINE_KIND != "real", reason="needs the real engine (prefix cache)")
def test_second_turns_reach_the_core_of_their_first():
    proc = start_server(["--data-parallel-size", "2"])
    try:
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = client.models.list().data[0].id
        greedy = {"temperature": 0, "max_tokens": 8}
        for user in range(2):  # different system prompts: no page in common, so the router spreads them
            first_messages = [{"role": "system", "content": f"{user} " * 3 + "You are a careful assistant. " * 6},
                              {"role": "user", "content": "SAY:The capital of France is Paris."}]
            first = client.chat.completions.create(model=model, messages=first_messages, **greedy)
            second = client.chat.completions.create(model=model, messages=first_messages + [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "SAY:And what about Spain?"}], **greedy)
            floor = first.usage.prompt_tokens // 16 * 16
            assert second.usage.prompt_tokens_details.cached_tokens >= floor > 0
        metrics = httpx.get(proc.url + "/metrics").text
        routed = {engine: float(value) for engine, value in re.findall(
            r'^lightspeed:data_parallel_routed_requests_total\{engine="(\d)",model_name="[^"]*"\} (\S+)$',
            metrics, re.M)}
        assert routed == {"0": 2.0, "1": 2.0}  # one conversation each, both turns on one core
        assert re.search(r'^lightspeed:num_requests_running\{engine="1"', metrics, re.M)
    finally:
        stop_cleanly(proc)
