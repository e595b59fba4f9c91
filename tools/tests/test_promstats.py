"""Prefix-cache counters from Prometheus text."""

import pytest
from lightspeed_bench.promstats import cache_delta, parse_counters

PAGE = """# HELP vllm:prefix_cache_hits_total hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prompt_tokens_total{model_name="m"} 1200.0
vllm:e2e_request_latency_seconds_bucket{le="1.0"} 3.0
vllm:e2e_request_latency_seconds_count 3.0
vllm:num_requests_running 2.0
"""


def test_parse_sums_labels_and_skips_unrelated_series():
    counters = parse_counters(PAGE)
    assert counters == {"vllm:prefix_cache_hits_total": 400.0, "vllm:prefix_cache_queries_total": 1000.0,
                        "vllm:prompt_tokens_total": 1200.0}


def test_delta_prefers_queries_then_prompt_tokens_then_client_count():
    before = parse_counters(PAGE)
    after = {k: v * 2 for k, v in before.items()}
    assert cache_delta(before, after, 999)["cached_fraction"] == pytest.approx(400 / 1000)
    no_queries = {k: v for k, v in after.items() if "queries" not in k}
    assert cache_delta(before, no_queries, 999)["cached_fraction"] == pytest.approx(400 / 1200)
    only_hits = {"lightspeed:prefix_cache_hit_tokens_total": 50.0}
    assert cache_delta({}, only_hits, 200)["cached_fraction"] == pytest.approx(0.25)
    assert cache_delta(None, after, 1) is None
    assert cache_delta({}, {"vllm:prompt_tokens_total": 5.0}, 1)["cached_fraction"] is None


def test_speculative_decoding_counters_give_the_acceptance_length():
    page = """lightspeed:spec_decode_num_drafts_total{model_name="m"} 10.0
lightspeed:spec_decode_num_draft_tokens_total{model_name="m"} 40.0
lightspeed:spec_decode_num_accepted_tokens_total{model_name="m"} 25.0
lightspeed:spec_decode_acceptance_length_bucket{le="1.0",model_name="m"} 2.0
"""
    before = {"lightspeed:spec_decode_num_drafts_total": 2.0, "lightspeed:spec_decode_num_draft_tokens_total": 8.0,
              "lightspeed:spec_decode_num_accepted_tokens_total": 1.0}
    delta = cache_delta(before, parse_counters(page), 1)
    assert delta["spec_acceptance_length"] == pytest.approx((24 + 8) / 8)
    assert delta["spec_draft_acceptance_rate"] == pytest.approx(24 / 32)
    assert "spec_acceptance_length" not in cache_delta({}, parse_counters(PAGE), 1)
