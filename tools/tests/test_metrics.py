"""Every figure of a level, checked against hand-computed values on hand-built records."""

import numpy as np
import pytest
from lightspeed_bench.client import RequestRecord
from lightspeed_bench.metrics import best_at_floor, summarize_level


def _rec(conv, turn, start, chunks, end, prompt, cached, ideal, warmup=False, error=None):
    return RequestRecord(conv, turn, level=2, warmup=warmup, start=start,
                         first_token=chunks[0] if chunks else None, end=end, chunk_times=list(chunks),
                         prompt_tokens=prompt, completion_tokens=len(chunks) if chunks else None,
                         cached_tokens=cached, ideal_cached_tokens=ideal, error=error)


@pytest.fixture
def records():
    return [
        # warm-up: excluded although it is the fastest and earliest
        _rec("c", 0, -1.0, [-0.99, -0.98], -0.97, 10, 0, 0, warmup=True),
        _rec("a", 0, 0.0, [0.10, 0.12, 0.14, 0.16, 0.18], 0.20, 1000, 600, 800),  # TTFT 100, TPOT 20
        _rec("a", 1, 1.0, [1.30, 1.34, 1.38], 1.40, 1200, 1000, 1100),  # TTFT 300, TPOT 40
        _rec("b", 0, 0.5, [0.70, 0.71, 0.72, 0.73, 0.74], 0.75, 500, None, 0),  # TTFT 200, TPOT 10
        _rec("b", 1, 0.8, [0.85], 0.9, None, None, None, error="dropped_stream"),
        _rec("d", 0, 0.9, [0.95], 2.0, None, None, None, error="cancelled"),  # drain time ran out
    ]


def test_latency_distributions(records):
    s = summarize_level(records, concurrency=2, num_gpus=2)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["ttft_ms"]["p90"] == pytest.approx(280.0)  # linear interpolation over [100, 200, 300]
    assert s["ttft_ms"]["p99"] == pytest.approx(298.0)
    assert s["tpot_ms"]["mean"] == pytest.approx(70.0 / 3)
    assert s["tpot_ms"]["p50"] == pytest.approx(20.0)
    # ITLs: 4 x 20 ms, 2 x 40 ms, 4 x 10 ms
    assert s["itl_ms"]["p50"] == pytest.approx(20.0)
    assert s["itl_ms"]["p90"] == pytest.approx(40.0)
    assert s["itl_ms"]["mean"] == pytest.approx(200.0 / 10)


def test_per_user_speed(records):
    s = summarize_level(records, concurrency=2, num_gpus=2)
    assert s["tokens_per_s_per_user"] == pytest.approx(1000.0 / (70.0 / 3))
    # user a: mean TPOT 30 ms -> 33.3 tok/s; user b: 10 ms -> 100 tok/s; p10 interpolates
    assert s["tokens_per_s_per_user_p10"] == pytest.approx(1000 / 30 + 0.1 * (100 - 1000 / 30))


def test_throughput_and_counts(records):
    s = summarize_level(records, concurrency=2, num_gpus=2)
    assert s["requests"] == 6 and s["requests_warmup"] == 1 and s["requests_measured"] == 3
    assert s["errors"] == {"dropped_stream": 1} and s["error_count"] == 1
    assert s["cancelled_at_deadline"] == 1
    assert s["window_s"] == pytest.approx(1.4)  # first measured start 0.0 -> last measured end 1.4
    assert s["output_tokens"] == 13 and s["input_tokens"] == 2700
    assert s["output_tokens_per_min_per_gpu"] == pytest.approx(13 * 60 / 1.4 / 2)
    assert s["total_tokens_per_min_per_gpu"] == pytest.approx(2713 * 60 / 1.4 / 2)
    assert s["request_throughput_per_s"] == pytest.approx(3 / 1.4)


def test_cache_fractions(records):
    s = summarize_level(records, concurrency=2, num_gpus=1)
    # only requests that reported cached_tokens count: (600 + 1000) / (1000 + 1200)
    assert s["cached_fraction"] == pytest.approx(1600 / 2200)
    assert s["cached_reported_requests"] == 2
    assert s["cached_fraction_incl_warmup"] == pytest.approx(1600 / 2210)
    assert s["ideal_cached_fraction"] == pytest.approx(1900 / 2700)
    assert s["ideal_cached_fraction_paged"] is None
    paged = summarize_level(records, concurrency=2, num_gpus=1, page_size=16)
    assert paged["ideal_cached_fraction_paged"] == pytest.approx((800 + 1088) / 2700)


def test_tpot_needs_two_tokens_and_empty_level():
    one = _rec("a", 0, 0.0, [0.1], 0.2, 10, None, None)
    assert one.tpot is None and one.ttft == pytest.approx(0.1)
    s = summarize_level([one], concurrency=1, num_gpus=1)
    assert s["tokens_per_s_per_user"] is None and s["tokens_per_s_per_user_p10"] is None
    assert s["cached_fraction"] is None
    empty = summarize_level([], concurrency=1, num_gpus=1)
    assert empty["output_tokens_per_min_per_gpu"] == 0.0 and empty["ttft_ms"]["p50"] is None


def test_tpot_uses_usage_token_count_when_chunks_carry_several_tokens():
    rec = _rec("a", 0, 0.0, [0.1, 0.2, 0.3], 0.3, 10, None, None)
    rec.completion_tokens = 9  # 3 chunks of 3 tokens each, as usage reports
    assert rec.tpot == pytest.approx(0.2 / 8)
    assert np.allclose(rec.itls, [0.1, 0.1])


def test_best_at_floor_uses_the_p10_user():
    levels = [
        {"concurrency": 1, "tokens_per_s_per_user_p10": 120.0, "output_tokens_per_min_per_gpu": 5000.0},
        {"concurrency": 4, "tokens_per_s_per_user_p10": 75.0, "output_tokens_per_min_per_gpu": 15000.0},
        {"concurrency": 16, "tokens_per_s_per_user_p10": 40.0, "output_tokens_per_min_per_gpu": 30000.0},
    ]
    assert best_at_floor(levels, 70)["concurrency"] == 4
    assert best_at_floor(levels, 100)["output_tokens_per_min_per_gpu"] == 5000.0
    assert best_at_floor(levels, 500) is None
