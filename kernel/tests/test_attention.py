"""Paged attention references against a dense, independent softmax(QK^T)V per request."""

import math

import pytest
import torch
from lightspeed_kernel import ops

from .paged_helpers import build_batch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def _dense_reference(q, batch, q_lens, scale, soft_cap=None, k_scale=None, v_scale=None, cache_dtype=None):
    # float64, one request at a time, full [S, S] causal mask, last q_len rows kept
    outs = []
    start = 0
    for b, q_len in enumerate(q_lens):
        k, v = batch["k_seq"][b], batch["v_seq"][b]
        if cache_dtype is not None:  # what an fp8 cache holds, dequantised
            k = (k.float() / k_scale).to(cache_dtype).double() * k_scale
            v = (v.float() / v_scale).to(cache_dtype).double() * v_scale
        k, v = k.double(), v.double()
        seq_len, num_kv_heads = k.shape[0], k.shape[1]
        group = q.shape[1] // num_kv_heads
        qb = q[start : start + q_len].double()
        start += q_len
        out = torch.zeros(q_len, q.shape[1], q.shape[2], dtype=torch.float64)
        causal = torch.ones(seq_len, seq_len).tril().bool()[seq_len - q_len :]
        for h in range(q.shape[1]):
            scores = qb[:, h] @ k[:, h // group].t() * scale
            if soft_cap:
                scores = soft_cap * torch.tanh(scores / soft_cap)
            scores = scores.masked_fill(~causal, -math.inf)
            out[:, h] = torch.softmax(scores, -1) @ v[:, h // group]
        outs.append(out)
    return torch.cat(outs) if outs else torch.zeros(0, q.shape[1], q.shape[2], dtype=torch.float64)


def _run(op, cached, q_lens, page_size, dtype, heads=(6, 2), head_dim=32, soft_cap=None, fp8=None, seed=0):
    num_q_heads, num_kv_heads = heads
    batch = build_batch(cached, q_lens, page_size, num_kv_heads, head_dim, dtype, seed=seed)
    cache_dtype = fp8 or dtype
    k_cache = torch.zeros(batch["cache_shape"], dtype=cache_dtype)
    v_cache = torch.zeros(batch["cache_shape"], dtype=cache_dtype)
    k_scale, v_scale = (0.25, 0.5) if fp8 else (None, None)
    for b, slots in enumerate(batch["seq_slots"]):  # prefix and new tokens, all stored
        ops.store_kv(
            batch["k_seq"][b], batch["v_seq"][b], k_cache, v_cache, slots, k_scale=k_scale, v_scale=v_scale
        )
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=torch.Generator().manual_seed(seed + 1)).to(
        dtype
    )
    scale = head_dim**-0.5
    got = op(
        q,
        k_cache,
        v_cache,
        batch["page_table"],
        batch["query_start_loc"],
        batch["seq_lens"],
        max_query_len=max(q_lens, default=0),
        scale=scale,
        soft_cap=soft_cap,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    expected = _dense_reference(q, batch, q_lens, scale, soft_cap, k_scale, v_scale, fp8)
    assert got.shape == q.shape and got.dtype == dtype
    return got, expected


PREFILL_CASES = [
    ([], []),  # empty batch
    ([0], [1]),  # length 1
    ([0], [16]),  # exactly one page (page 16)
    ([0, 15, 16], [17, 1, 16]),  # page boundaries
    ([63, 0], [2, 64]),  # across a 64-page boundary
    ([100, 7, 3], [40, 0, 5]),  # cached prefix + new tokens; a request with no new token
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("cached,q_lens", PREFILL_CASES)
def test_prefill(dtype, page_size, cached, q_lens):
    got, expected = _run(ops.attention_prefill, cached, q_lens, page_size, dtype)
    torch.testing.assert_close(got.double(), expected, rtol=TOL[dtype], atol=TOL[dtype])


DECODE_CASES = [
    ([], []),
    ([0], [1]),  # first token only
    ([15, 16, 31], [1, 1, 1]),  # seq_len at and across page boundaries
    ([50, 3, 64], [4, 16, 2]),  # speculative: several query tokens, causal among them
    ([200, 0], [16, 16]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("cached,q_lens", DECODE_CASES)
def test_decode(dtype, page_size, cached, q_lens):
    got, expected = _run(ops.attention_decode, cached, q_lens, page_size, dtype)
    torch.testing.assert_close(got.double(), expected, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("op", [ops.attention_prefill, ops.attention_decode])
@pytest.mark.parametrize("heads", [(4, 4), (8, 1), (9, 3)])
def test_gqa_soft_cap(op, heads):
    got, expected = _run(op, [20, 33], [3, 5], 16, torch.float32, heads=heads, soft_cap=5.0, seed=3)
    torch.testing.assert_close(got.double(), expected, rtol=2e-5, atol=2e-5)
    plain, _ = _run(op, [20, 33], [3, 5], 16, torch.float32, heads=heads, seed=3)
    assert not torch.allclose(got, plain)  # the cap changed something


@pytest.mark.parametrize("op", [ops.attention_prefill, ops.attention_decode])
def test_fp8_cache(op):
    got, expected = _run(op, [30, 0], [2, 9], 16, torch.bfloat16, fp8=torch.float8_e4m3fn, seed=5)
    torch.testing.assert_close(got.double(), expected, rtol=2e-2, atol=2e-2)


def test_out_argument_and_prefill_equals_decode():
    batch = build_batch([40, 5], [3, 16], 16, 2, 32, torch.float32, seed=9)
    k_cache = torch.zeros(batch["cache_shape"])
    v_cache = torch.zeros(batch["cache_shape"])
    for b, slots in enumerate(batch["seq_slots"]):
        ops.store_kv(batch["k_seq"][b], batch["v_seq"][b], k_cache, v_cache, slots)
    q = torch.randn(19, 4, 32)
    args = (q, k_cache, v_cache, batch["page_table"], batch["query_start_loc"], batch["seq_lens"])
    out = torch.empty_like(q)
    assert ops.attention_prefill(*args, max_query_len=16, scale=0.2, out=out) is out
    torch.testing.assert_close(
        ops.attention_decode(*args, max_query_len=16, scale=0.2), out, rtol=1e-5, atol=1e-5
    )


def test_unused_page_table_entries_are_ignored():
    # entries past a request's pages may hold stale page ids; the result must not change
    batch = build_batch([10], [2], 16, 1, 16, torch.float32, seed=11)
    k_cache = torch.randn(batch["cache_shape"])
    v_cache = torch.randn(batch["cache_shape"])
    ops.store_kv(batch["k_seq"][0], batch["v_seq"][0], k_cache, v_cache, batch["seq_slots"][0])
    q = torch.randn(2, 2, 16)
    args = (k_cache, v_cache)
    rest = (batch["query_start_loc"], batch["seq_lens"])
    clean = ops.attention_decode(q, *args, batch["page_table"], *rest, max_query_len=2, scale=0.25)
    stale = batch["page_table"].clone()
    stale[0, 1:] = batch["cache_shape"][0] - 1
    for op in (ops.attention_decode, ops.attention_prefill):
        torch.testing.assert_close(op(q, *args, stale, *rest, max_query_len=2, scale=0.25), clean)


@pytest.mark.parametrize("op", [ops.attention_prefill, ops.attention_decode])
def test_memory_bounded_chunking_gives_the_same_result(op, monkeypatch):
    # a tiny element budget forces query chunks (prefill) and request chunks (decode)
    from lightspeed_kernel.reference import attention as reference

    monkeypatch.setattr(reference, "_ELEMENT_BUDGET", 2000)
    got, expected = _run(op, [40, 0, 17, 70], [3, 16, 1, 9], 16, torch.float32, seed=13)
    torch.testing.assert_close(got.double(), expected, rtol=2e-5, atol=2e-5)
