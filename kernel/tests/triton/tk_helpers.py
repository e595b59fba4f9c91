"""Comparison helpers of the Triton tests."""

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN counts as failure)."""
    o, r = out.double(), ref.double()
    if torch.isnan(o).any():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


# bf16 holds ~3 significant digits: a single rounding of each output gives ~4e-3 relative error
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def assert_rounded_equal(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Bitwise equal on the GPU; under the interpreter, whose fp32 -> bf16 cast truncates instead of
    rounding to nearest even, within one bf16 ulp."""
    if interpreting() and got.dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), ref.float(), rtol=2.0**-7, atol=1e-30)
    else:
        assert torch.equal(got, ref)


def paged_batch(
    cached_lens,
    q_lens,
    page_size,
    num_q_heads,
    num_kv_heads,
    head_dim,
    dtype,
    device,
    *,
    cache_dtype=None,
    spare_pages=2,
    extra_table_cols=1,
    seed=0,
):
    """A random paged batch: every cache slot (page 0, unused pages and slots past a request's end too)
    holds random values, so a kernel that reads what it must not gets a wrong answer.

    Returns dict(q [T, Hq, D], k_cache, v_cache, page_table int32 [B, P], query_start_loc int32 [B+1],
    seq_lens int32 [B], max_query_len)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + n for c, n in zip(cached_lens, q_lens, strict=True)]
    pages_per_req = [-(-s // page_size) for s in seq_lens]
    num_pages = 1 + sum(pages_per_req) + spare_pages
    order = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    width = max(pages_per_req, default=0) + extra_table_cols
    # unused page-table entries point at the padding page 0
    page_table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for b, n in enumerate(pages_per_req):
        page_table[b, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    cache_dtype = cache_dtype or dtype
    k_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(cache_dtype)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    q = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=gen).to(dtype)
    to = {"device": device}
    return {
        "q": q.to(**to),
        "k_cache": k_cache.to(**to),
        "v_cache": v_cache.to(**to),
        "page_table": page_table.to(**to),
        "query_start_loc": qsl.to(**to),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32).to(**to),
        "max_query_len": max(q_lens, default=0),
    }


def assert_fp8_codes_match(got: torch.Tensor, want: torch.Tensor) -> None:
    """e4m3 tensors: equal codes on the GPU (at most 0.1% differ, at rounding ties of differently
    ordered fp32 math). Under the interpreter its fp32 -> e4m3 cast rounds imperfectly (a neighbouring
    code) and forgets the exponent carry when rounding up to a power of two (127.7 -> 64, not 128):
    only those deviations are allowed there. A neighbouring code is 1/8 away for normal values and one
    subnormal step (2^-9) below 2^-6, where that step is more than 1/8 of the value."""
    g, w = got.float(), want.float()
    differ = g != w
    if interpreting():
        gd, wd = g[differ], w[differ]
        subnormal_step = torch.finfo(got.dtype).tiny / 8  # e4m3: 3 mantissa bits under the smallest normal
        neighbour = (gd - wd).abs() <= torch.clamp(wd.abs() * 0.125, min=subnormal_step)
        carry_lost = (wd.abs().log2().frac() == 0) & (gd == wd / 2)
        assert (neighbour | carry_lost).all()
    elif g.numel():
        assert differ.float().mean().item() < 1e-3
