import math

import pytest
import torch
from lightspeed_kernel.reference import attention as ref
from lightspeed_kernel.triton import attention_decode as dec
from lightspeed_kernel.triton import attention_prefill as pre
from tk_helpers import TOL, paged_batch, rel_err

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# p @ V runs on tensor cores in the input dtype (fp32: tf32 on the GPU), so allow a bit more than one rounding
ATOL = {torch.float32: 2e-3, torch.float16: 4e-3, torch.bfloat16: 2.5e-2}


def _args(batch):
    return (
        batch["q"],
        batch["k_cache"],
        batch["v_cache"],
        batch["page_table"],
        batch["query_start_loc"],
        batch["seq_lens"],
    )


def _kw(batch, **extra):
    d = batch["q"].shape[-1]
    return {"max_query_len": batch["max_query_len"], "scale": 1.0 / math.sqrt(d), **extra}


def _check(got, want, dtype):
    assert got.shape == want.shape
    if want.numel():
        assert rel_err(got, want) < max(TOL[dtype], ATOL[dtype]), rel_err(got, want)


# (cached lens, new-token lens) per request: length 1, page boundaries (15/16/17, 63/64/65), mixed
DECODE_CASES = [
    ([0], [1]),
    ([15, 16, 63], [1, 1, 1]),
    ([16, 64, 1], [1, 1, 3]),
    ([5, 40], [4, 2]),
    ([120], [16]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("cached,q_lens", DECODE_CASES)
def test_decode_matches_reference(device, dtype, page_size, cached, q_lens):
    batch = paged_batch(cached, q_lens, page_size, 4, 2, 32, dtype, device)
    want = ref.attention_decode(*_args(batch), **_kw(batch))
    out = torch.full_like(batch["q"], float("nan"))
    got = dec.attention_decode(*_args(batch), **_kw(batch, out=out))
    assert got is out
    _check(got, want, dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
@pytest.mark.parametrize("group", [1, 4, 6])
def test_decode_split_kv_and_gqa(device, num_splits, group):
    # 6 query heads per kv head: a group that is not a power of two
    batch = paged_batch([70, 9, 33], [2, 1, 3], 16, 2 * group, 2, 64, torch.bfloat16, device, seed=num_splits)
    want = ref.attention_decode(*_args(batch), **_kw(batch))
    q = batch["q"]
    plan = dec.plan_decode(
        3,
        q.shape[1],
        2,
        64,
        16,
        batch["page_table"].shape[1],
        batch["max_query_len"],
        num_splits=num_splits,
        block_n=16,
    )
    workspace = torch.empty(dec.decode_workspace_numel(plan, q.shape[0], q.shape[1], 64), device=device)
    got = dec.run_decode(plan, *_args(batch), scale=0.125, workspace=workspace)
    _check(got, want, torch.bfloat16)


@pytest.mark.parametrize("soft_cap", [None, 5.0])
def test_decode_soft_cap_and_fp8(device, soft_cap):
    batch = paged_batch(
        [30, 3], [1, 2], 16, 8, 2, 32, torch.bfloat16, device, cache_dtype=torch.float8_e4m3fn
    )
    kw = _kw(batch, soft_cap=soft_cap, k_scale=0.5, v_scale=torch.tensor(2.0, device=device))
    _check(
        dec.attention_decode(*_args(batch), **kw), ref.attention_decode(*_args(batch), **kw), torch.bfloat16
    )


def test_decode_empty_batch(device):
    batch = paged_batch([], [], 16, 4, 2, 32, torch.float16, device)
    got = dec.attention_decode(*_args(batch), **_kw(batch, max_query_len=1))
    assert got.shape == (0, 4, 32)


def test_decode_rejects_too_many_query_tokens(device):
    batch = paged_batch([3], [17], 16, 4, 2, 32, torch.float16, device)
    with pytest.raises(ValueError):
        dec.attention_decode(*_args(batch), **_kw(batch))


PREFILL_CASES = [
    ([0], [1]),
    ([0, 0], [17, 16]),
    ([16, 5], [33, 1]),
    ([63, 0, 64], [2, 40, 1]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("cached,q_lens", PREFILL_CASES)
def test_prefill_matches_reference(device, dtype, page_size, cached, q_lens):
    batch = paged_batch(cached, q_lens, page_size, 4, 2, 32, dtype, device)
    want = ref.attention_prefill(*_args(batch), **_kw(batch))
    out = torch.full_like(batch["q"], float("nan"))
    got = pre.attention_prefill(*_args(batch), **_kw(batch, out=out))
    assert got is out
    _check(got, want, dtype)


@pytest.mark.parametrize("head_dim", [48, 64])
def test_prefill_whole_tiles_left_of_the_diagonal(device, head_dim):
    # Long cached prefixes and several query blocks: most key tiles sit left of each block's causal
    # diagonal and take the unmasked path; head_dim 48 pads to 64 (the dim mask stays on there).
    batch = paged_batch([70, 33, 0], [45, 40, 50], 16, 8, 2, head_dim, torch.float32, device, seed=5)
    _check(
        pre.attention_prefill(*_args(batch), **_kw(batch)),
        ref.attention_prefill(*_args(batch), **_kw(batch)),
        torch.float32,
    )


@pytest.mark.parametrize("hq,hkv", [(4, 2), (8, 2), (6, 1), (2, 2)])
@pytest.mark.parametrize("block_m", [16, 32])
def test_prefill_with_query_heads_packed_per_kv_head(device, hq, hkv, block_m):
    # Rows = tokens x the query heads of one KV head (6 heads: 16 rows hold 2 tokens, 4 rows idle);
    # long prefixes put most tiles left of the diagonal; a zero-length request rides along.
    batch = paged_batch([70, 0, 33, 5], [45, 17, 0, 3], 16, hq, hkv, 32, torch.float32, device, seed=7)
    want = ref.attention_prefill(*_args(batch), **_kw(batch))
    q, kc, vc, table, qsl, seq_lens = _args(batch)
    kw = _kw(batch)
    out = torch.full_like(q, float("nan"))
    pre.launch_prefill(q, kc, vc, table, qsl, seq_lens, out, table.shape[0], hq, hkv, q.shape[2],
                       max_query_len=kw["max_query_len"], scale=kw["scale"], soft_cap=None, k_scale=None,
                       v_scale=None, tiles=pre.PrefillTiles(block_m, 16, 4, 1, pack_gqa=True))
    _check(out, want, torch.float32)


def test_prefill_with_the_mask_free_loop_warp_specialised(device):
    # Triton's autoWS on sm_90 reorders loads and MMAs across warps; the result must not move. The
    # interpreter has no warps (the launch drops the flag there), so on CPU this checks the plumbing.
    batch = paged_batch([300, 0, 129], [200, 150, 70], 16, 8, 2, 128, torch.bfloat16, device, seed=11)
    want = ref.attention_prefill(*_args(batch), **_kw(batch))
    q, kc, vc, table, qsl, seq_lens = _args(batch)
    kw = _kw(batch)
    tiles = pre.PrefillTiles(128, 64, 8, 2, warp_specialize=True) if device == "cuda" else \
        pre.PrefillTiles(32, 16, 4, 1, warp_specialize=True)
    out = torch.full_like(q, float("nan"))
    pre.launch_prefill(q, kc, vc, table, qsl, seq_lens, out, table.shape[0], 8, 2, 128,
                       max_query_len=kw["max_query_len"], scale=kw["scale"], soft_cap=None, k_scale=None,
                       v_scale=None, tiles=tiles)
    _check(out, want, torch.bfloat16)


@pytest.mark.parametrize("soft_cap", [None, 20.0])
def test_prefill_soft_cap_fp8_gqa(device, soft_cap):
    batch = paged_batch(
        [20, 0], [19, 5], 16, 6, 1, 64, torch.float16, device, cache_dtype=torch.float8_e4m3fn
    )
    kw = _kw(batch, soft_cap=soft_cap, k_scale=torch.tensor(0.25, device=device), v_scale=1.5)
    _check(
        pre.attention_prefill(*_args(batch), **kw), ref.attention_prefill(*_args(batch), **kw), torch.float16
    )


def test_prefill_with_zero_length_request(device):
    batch = paged_batch([4, 7, 2], [3, 0, 2], 16, 2, 2, 16, torch.float32, device)
    _check(
        pre.attention_prefill(*_args(batch), **_kw(batch)),
        ref.attention_prefill(*_args(batch), **_kw(batch)),
        torch.float32,
    )


def test_prefill_equals_decode_for_short_queries(device):
    batch = paged_batch([50, 17], [3, 1], 16, 8, 2, 64, torch.bfloat16, device)
    a = pre.attention_prefill(*_args(batch), **_kw(batch))
    b = dec.attention_decode(*_args(batch), **_kw(batch))
    assert rel_err(a, b) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_gpu_sizes(page_size, dtype):
    # Llama-3-8B heads; contexts up to 5K with prefix caching; decode with 1 and 4 query tokens
    cached = [0, 1000, 4999, 17]
    batch = paged_batch(cached, [300, 64, 1, 129], page_size, 32, 8, 128, dtype, "cuda", seed=3)
    _check(
        pre.attention_prefill(*_args(batch), **_kw(batch)),
        ref.attention_prefill(*_args(batch), **_kw(batch)),
        dtype,
    )
    batch = paged_batch(
        [8191, 33, 2048, 100, 0] * 4, [1, 1, 4, 16, 1] * 4, page_size, 32, 8, 128, dtype, "cuda"
    )
    _check(
        dec.attention_decode(*_args(batch), **_kw(batch)),
        ref.attention_decode(*_args(batch), **_kw(batch)),
        dtype,
    )


@pytest.mark.gpu
def test_decode_cuda_graph_replay():
    batch = paged_batch([3000] * 8, [1] * 8, 16, 32, 8, 128, torch.bfloat16, "cuda")
    q = batch["q"]
    plan = dec.plan_decode(8, 32, 8, 128, 16, batch["page_table"].shape[1], 1)
    assert plan.num_splits > 1
    ws = torch.empty(dec.decode_workspace_numel(plan, q.shape[0], 32, 128), device="cuda")
    out = torch.empty_like(q)
    dec.run_decode(plan, *_args(batch), scale=0.088, out=out, workspace=ws)  # compile outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec.run_decode(plan, *_args(batch), scale=0.088, out=out, workspace=ws)
    q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    want = ref.attention_decode(*_args(batch), max_query_len=1, scale=0.088)
    _check(out, want, torch.bfloat16)


@pytest.mark.gpu
def test_public_decode_op_graph_replays_any_seq_len():
    """What an engine's decode graph does: the public op (workspace allocated inside the capture, from
    the graph's pool) captured once over a fixed-width page table; replays with other requests' pages
    and lengths (1 .. 4001 tokens, several splits each) must match the reference each time."""
    from lightspeed_kernel import ops

    b, page_size, max_pages = 8, 16, 256
    big = paged_batch([4000, 17, 1000, 15, 63, 2500, 0, 300], [1] * b, page_size, 32, 8, 128, torch.bfloat16, "cuda")
    assert dec.plan_decode(b, 32, 8, 128, page_size, max_pages, 1).num_splits > 1
    caches = (big["k_cache"], big["v_cache"])
    page_table = torch.zeros(b, max_pages, dtype=torch.int32, device="cuda")  # [B, P], static
    seq_lens = torch.ones(b, dtype=torch.int32, device="cuda")
    qsl = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    q = torch.zeros_like(big["q"])
    kw = {"max_query_len": 1, "scale": 128**-0.5}
    ops.attention_decode(q, *caches, page_table, qsl, seq_lens, **kw)  # compile outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.attention_decode(q, *caches, page_table, qsl, seq_lens, **kw)
    gen = torch.Generator().manual_seed(1)
    for frac in (1.0, 0.5, 0.02, 1.0):
        perm = torch.randperm(b, generator=gen).cuda()
        page_table.zero_()
        page_table[:, : big["page_table"].shape[1]].copy_(big["page_table"][perm])
        seq_lens.copy_((big["seq_lens"][perm].float() * frac).ceil().clamp(min=1).int())
        q.copy_(torch.randn(q.shape, generator=gen).to(q))
        graph.replay()
        torch.cuda.synchronize()
        want = ref.attention_decode(q, *caches, page_table, qsl, seq_lens, **kw)
        print(f"frac {frac}: seq_lens {seq_lens.tolist()} rel err {rel_err(out, want):.2e}")
        _check(out, want, torch.bfloat16)


def test_decode_under_a_page_table_wider_than_every_request(device):
    # A CUDA graph's page table is max_model_len wide, so the plan sizes splits for that width; each
    # request splits its own keys over all the programs instead (checked against the reference).
    batch = paged_batch([99, 700, 0, 250], [1, 1, 1, 4], 16, 4, 2, 32, torch.float32, device, seed=11)
    wide = batch["page_table"].new_zeros(batch["page_table"].shape[0], 256)
    wide[:, : batch["page_table"].shape[1]] = batch["page_table"]
    batch = {**batch, "page_table": wide}
    plan = dec.plan_decode(4, 4, 2, 32, 16, 256, 4)
    assert plan.num_splits > 1 and plan.split_tokens > 700  # one split would hold any request whole
    _check(dec.attention_decode(*_args(batch), **_kw(batch)), ref.attention_decode(*_args(batch), **_kw(batch)),
           torch.float32)


@pytest.mark.parametrize("batch,max_pages", [(1, 2048), (16, 512), (64, 512), (256, 2048), (3, 1)])
def test_plan_decode_splits(batch, max_pages):
    plan = dec.plan_decode(batch, 32, 8, 128, 16, max_pages, 1, num_sms=132)
    ctx = max_pages * 16
    assert plan.split_tokens % plan.block_n == 0
    assert plan.num_splits * plan.split_tokens >= ctx  # every key is covered
    assert (plan.num_splits - 1) * plan.split_tokens < ctx  # no split starts past the page table
    if batch * 8 >= 3 * 132:
        assert plan.num_splits == 1  # enough (request, kv head) programs already: no combine pass
    elif ctx >= 512:
        assert plan.num_splits > 1 and plan.split_tokens >= (64 if batch * 8 <= dec.SMALL_GRID_PROGRAMS else 256)
    ws = dec.decode_workspace_numel(plan, batch, 32, 128)
    assert ws == (0 if plan.num_splits == 1 else batch * 32 * plan.num_splits * 129)


def test_small_grid_plans_are_the_h200_sweeps_winners():
    # bench/results/h200_profile_2026-12-03_1156/kernels_*: the fastest launch of block_n x warps x
    # stages x splits at batch 1 x 8K / 1 x 32K / 2 x 32K (32 q, 8 kv heads, page 16)
    for batch, ctx, splits in ((1, 8192, 86), (1, 32768, 94), (2, 32768, 49)):
        plan = dec.plan_decode(batch, 32, 8, 128, 16, ctx // 16, 1, num_sms=132)
        assert (plan.block_n, plan.num_splits, plan.num_warps, plan.num_stages) == (32, splits, 4, 2)
    larger = dec.plan_decode(4, 32, 8, 128, 16, 8192 // 16, 1, num_sms=132)  # 32 programs: the general rule
    assert larger.block_n == 64 and larger.split_tokens >= 256


def test_plan_decode_is_planned_once_per_shape():
    # every layer of a step asks for the same plan: the second ask is the first plan, not a new one
    first = dec.plan_decode(8, 32, 8, 128, 16, 40, 1, num_sms=132)
    assert dec.plan_decode(8, 32, 8, 128, 16, 40, 1, num_sms=132) is first
    assert dec.plan_decode(9, 32, 8, 128, 16, 40, 1, num_sms=132) is not first
