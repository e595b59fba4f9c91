"""tools/bench/mla.py's accounting: the bytes and FLOPs a perfect MLA decode kernel must spend,
checked against the figures issue 15 quotes (the seeds' FP8 case, the 128-head compute cap)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mla  # noqa: E402

FP8_BYTES_PER_TOKEN = 512 + 4 + 64 * 2  # e4m3 latent, its fp32 scale, the bf16 rope key
BF16_BYTES_PER_TOKEN = 576 * 2


def test_the_seeds_fp8_case_is_memory_bound_at_198_us():
    cost = mla.decode_cost("fp8", batch=16, heads=16, q_len=4, ctx=81920, bytes_per_token=FP8_BYTES_PER_TOKEN)
    assert cost["bytes"] == 16 * 81920 * 644 + 16 * 4 * 16 * (576 + 512) * 2  # cache once, q in, out
    assert cost["flops"] == 2176 * 16 * 16 * 4 * 81920
    assert cost["bound"] == "memory"
    assert cost["roofline_us"] == pytest.approx(198.2, abs=0.1)
    assert cost["roofline_us"] / 0.85 == pytest.approx(233, abs=1)  # the 85% line: <= ~232 us


def test_128_heads_with_a_bf16_cache_are_compute_bound_near_78_percent_of_hbm():
    cost = mla.decode_cost("bf16", batch=16, heads=128, q_len=1, ctx=16384, bytes_per_token=BF16_BYTES_PER_TOKEN)
    assert cost["bound"] == "compute"
    memory_us = cost["bytes"] / mla.HBM_BPS * 1e6
    assert memory_us / cost["roofline_us"] == pytest.approx(0.78, abs=0.02)  # 0.78 cache only, 0.80 with q and out


def test_fp8_caches_are_judged_against_fp8_mmas():
    args = dict(batch=16, heads=128, q_len=1, ctx=16384, bytes_per_token=FP8_BYTES_PER_TOKEN)
    fp8 = mla.decode_cost("fp8", **args)
    assert fp8["roofline_us"] == pytest.approx(max(fp8["bytes"] / mla.HBM_BPS, fp8["flops"] / 1620e12) * 1e6)
