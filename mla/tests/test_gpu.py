"""Real shapes on the GPU (pytest -m gpu): bf16 and fp8 caches, page boundaries, q_len 1..16,
lengths 1..81920, CUDA-graph capture of plan/run, the non-absorbed prefill."""

import pytest
import torch
from lightspeed_mla import (
    MLACache,
    decode_workspace_bytes,
    mla_decode,
    mla_decode_reference,
    mla_prefill_reference,
    pack_kv,
    pack_kv_reference,
    plan_decode,
    run_decode,
)
from lightspeed_mla.prefill import mla_prefill
from mla_helpers import make_paged_cache, query_start, rel_err

pytestmark = pytest.mark.gpu
DEV = "cuda"
SCALE = 192 ** -0.5


def _decode_case(kind, page_size, lens, q_len, heads, seed=0, **overrides):
    g = torch.Generator().manual_seed(seed)
    cache, page_table = make_paged_cache(kind, page_size, lens, device=DEV, generator=g)
    qsl = query_start([q_len] * len(lens))
    q = torch.randn(int(qsl[-1]), heads, 576, generator=g).to(DEV, torch.bfloat16)
    out, lse = mla_decode(q, cache, page_table, torch.tensor(lens), qsl, SCALE, return_lse=True, **overrides)
    ref, ref_lse = mla_decode_reference(q, cache, page_table, torch.tensor(lens, device=DEV), qsl, SCALE)
    assert rel_err(out, ref) < 1.5e-2, (kind, page_size, lens, q_len, heads)
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("q_len", [1, 2, 4, 16])
def test_decode_pages_and_spec_tokens(kind, page_size, q_len):
    lens = [q_len, page_size, page_size + 1, 3 * page_size - 1, 1000 + q_len]
    _decode_case(kind, page_size, lens, q_len, 16, seed=q_len)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("heads,q_len", [(8, 16), (16, 4), (32, 2), (64, 1), (128, 1), (128, 8)])
def test_decode_heads(kind, heads, q_len):
    _decode_case(kind, 64, [700, 2049], q_len, heads, seed=heads)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_decode_long_lengths(kind):
    # 1 .. 81920 tokens in one batch, split-KV picked by the planner, and a forced fold-off run.
    _decode_case(kind, 64, [1, 64, 65, 81920], 1, 16, seed=4)
    _decode_case(kind, 64, [4, 63, 4097, 81920], 4, 16, seed=5)
    _decode_case(kind, 64, [81920], 4, 16, seed=6, fold=False)
    _decode_case(kind, 64, [81920, 30000], 16, 128, seed=7)


@pytest.mark.parametrize("num_splits", [1, 7, 64])
def test_decode_split_counts(num_splits):
    _decode_case("fp8", 64, [5000, 300, 17], 2, 16, seed=num_splits, num_splits=num_splits)


def test_decode_plan_run_under_cuda_graph():
    torch.manual_seed(0)
    H, q_len, lens = 16, 4, [3000, 9000, 40, 20000]
    cache, page_table = make_paged_cache("fp8", 64, [n + 64 for n in lens], device=DEV)
    B = len(lens)
    qsl = query_start([q_len] * B)
    T = B * q_len
    ws = torch.empty(decode_workspace_bytes(B, T, H, 16), dtype=torch.uint8, device=DEV)
    plan = plan_decode(ws, qsl, lens, H, page_size=64, softmax_scale=SCALE, cache_kind="fp8", num_splits=16)
    q = torch.randn(T, H, 576, device=DEV).to(torch.bfloat16)
    out = torch.empty(T, H, 512, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=DEV)
    run_decode(plan, q, cache, page_table, out, lse)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_decode(plan, q, cache, page_table, out, lse)
    for step in range(1, 3):  # the next steps: one token longer each, same plan shape
        new_lens = [n + step for n in lens]
        plan_decode(ws, qsl, new_lens, H, page_size=64, softmax_scale=SCALE, cache_kind="fp8", num_splits=16)
        q.copy_(torch.randn_like(q, dtype=torch.float32))
        out.fill_(float("nan"))
        graph.replay()
        ref, ref_lse = mla_decode_reference(q, cache, page_table, torch.tensor(new_lens, device=DEV), qsl, SCALE)
        assert rel_err(out, ref) < 1.5e-2
        torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_pack_kv_gpu_exact(kind):
    torch.manual_seed(0)
    T, pages, ps = 300, 8, 64
    latent, rope = torch.randn(T, 512, device=DEV) * 4, torch.randn(T, 64, device=DEV)
    slots = torch.randperm(pages * ps, device=DEV)[:T]
    slots[::17] = -1
    got, want = MLACache.empty(pages, ps, kind, DEV), MLACache.empty(pages, ps, kind, DEV)
    for c in (got, want):
        c.rope.zero_()
        c.latent.view(torch.uint8).zero_()
        if c.scale is not None:
            c.scale.zero_()
    pack_kv(latent.to(torch.bfloat16), rope.to(torch.bfloat16), slots, got)
    pack_kv_reference(latent.to(torch.bfloat16), rope.to(torch.bfloat16), slots, want)
    assert torch.equal(got.rope, want.rope)
    if kind == "fp8":
        torch.testing.assert_close(got.scale, want.scale, rtol=1e-6, atol=0)
        mismatch = (got.latent.view(torch.uint8) != want.latent.view(torch.uint8)).float().mean().item()
        assert mismatch < 1e-3  # division vs. reciprocal rounding may move a rare value by 1 ulp
    else:
        assert torch.equal(got.latent, want.latent)


@pytest.mark.parametrize("q_lens,kv_lens", [([2048], [2048]), ([1, 700, 129], [9000, 700, 4225])])
def test_prefill_real_shapes(q_lens, kv_lens):
    torch.manual_seed(1)
    H = 16
    T, Tk = sum(q_lens), sum(kv_lens)
    q_nope = torch.randn(T, H, 128, device=DEV).bfloat16()
    q_rope = torch.randn(T, H, 64, device=DEV).bfloat16()
    k_nope = torch.randn(Tk, H, 128, device=DEV).bfloat16()
    k_rope = torch.randn(Tk, 64, device=DEV).bfloat16()
    v = torch.randn(Tk, H, 128, device=DEV).bfloat16()
    cu_q, cu_k = query_start(q_lens).to(DEV), query_start(kv_lens).to(DEV)
    lse = torch.empty(T, H, device=DEV)
    out = mla_prefill(q_nope, q_rope, k_nope, k_rope, v, cu_q, cu_k, max(q_lens), SCALE, lse=lse)
    ref, ref_lse = mla_prefill_reference(q_nope, q_rope, k_nope, k_rope, v, cu_q, cu_k, SCALE)
    assert rel_err(out, ref) < 1.5e-2
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)
