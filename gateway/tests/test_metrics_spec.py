"""Speculative-decoding metrics on /metrics, read from the engine's stats snapshot."""

from lightspeed_gateway.server.metrics import EngineStatsCollector
from prometheus_client import CollectorRegistry, generate_latest

BASE = {"num_running": 1, "num_waiting": 0, "num_retracted": 0, "kv_usage": 0.1, "free_device_pages": 9,
        "prefix_hit_tokens": 0, "prefix_query_tokens": 0, "num_steps": 7}


def _scrape(stats: dict) -> str:
    registry = CollectorRegistry()
    registry.register(EngineStatsCollector(lambda: stats, "m"))
    return generate_latest(registry).decode()


def test_counters_and_acceptance_length_histogram():
    text = _scrape({**BASE, "spec_num_drafts": 5, "spec_num_draft_tokens": 15, "spec_num_accepted_tokens": 6,
                    "spec_acceptance_lengths": [0, 2, 1, 1, 1]})
    assert 'lightspeed:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 15.0' in text
    assert 'lightspeed:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 6.0' in text
    assert 'lightspeed:spec_decode_num_drafts_total{engine="0",model_name="m"} 5.0' in text
    assert 'lightspeed:spec_decode_acceptance_length_bucket{engine="0",le="1.0",model_name="m"} 2.0' in text
    assert 'lightspeed:spec_decode_acceptance_length_bucket{engine="0",le="3.0",model_name="m"} 4.0' in text
    assert 'lightspeed:spec_decode_acceptance_length_count{engine="0",model_name="m"} 5.0' in text
    assert 'lightspeed:spec_decode_acceptance_length_sum{engine="0",model_name="m"} 11.0' in text  # 2*1 + 2 + 3 + 4


def test_absent_without_speculative_decoding():
    text = _scrape({**BASE, "spec_acceptance_lengths": []})
    assert "spec_decode" not in text and "lightspeed:engine_steps" in text


def test_one_series_per_data_parallel_core():
    text = _scrape({"ranks": [{**BASE, "dp_rank": 0, "spec_acceptance_lengths": [0, 1, 1]},
                              {**BASE, "dp_rank": 1, "spec_acceptance_lengths": [0, 0, 3]}]})
    assert 'lightspeed:spec_decode_acceptance_length_sum{engine="0",model_name="m"} 3.0' in text
    assert 'lightspeed:spec_decode_acceptance_length_sum{engine="1",model_name="m"} 6.0' in text
