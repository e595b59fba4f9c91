"""The sm_90a CUDA decode kernel (`mla_decode_sm90`) against `mla_decode_reference` on an H100 / H200
(pytest -m gpu): page sizes 16 / 32 / 64, q_len 1..16, lengths 1..81920 with the awkward ones, heads
16..128, forced split counts, NaN in page tails, CUDA-graph capture with changing lengths. The bf16 cache
first, then the FP8 cache (kind "fp8": bf16 scores, the bounds of the Triton kernel's FP8 tests), then the
e4m3-scores variant (kind "fp8qk", `mla_decode_sm90_fp8qk`): it is held to the same bounds against the
reference run on Q quantised as the kernel quantises it (one e4m3 scale a row), and its distance from the
unquantised reference is printed (and bounded loosely: Q's 3 mantissa bits cost 2-4% on random data);
last the all-e4m3 variant (kind "fp8mma", `mla_decode_sm90_fp8mma`): fp8qk's scores and P V on e4m3 MMAs,
P quantised per tile, so its bound against the quantised-Q reference is P's rounding (2.0-2.5% rel L2 in
mla/scripts/sm90_emulate.py fp8mma, which models the kernel's layouts but not the MMA's accumulation).
Every case prints its max abs / rel error (run with -s, or see the summary of a failure)."""

import pytest
import torch
from lightspeed_mla import decode_workspace_bytes, mla_decode_reference, sm90
from lightspeed_mla.reference import quantize_q_latent_e4m3
from mla_helpers import make_paged_cache, query_start, rel_err

pytestmark = pytest.mark.gpu
DEV = "cuda"
SCALE = 192 ** -0.5
# (rel L2, lse atol), as the Triton kernel's tests have them. fp8qk / fp8mma are held to them against the
# reference on Q quantised exactly as the kernel does it (quantize_q_latent_e4m3): until 2026-12-06 that
# reference divided 448 / amax one ulp off the kernel, flipped ~5% of Q's e4m3 bytes at rounding ties, and
# the lse bound had been loosened to 0.1 to hide a 1-3% gap in S that was the reference's, not the kernel's.
# fp8mma's rel bound is P's e4m3 rounding (2.0-2.5% in mla/scripts/sm90_emulate.py fp8mma).
BOUNDS = {"bf16": (1.5e-2, 2e-2), "fp8": (1.5e-2, 2e-2), "fp8qk": (1.5e-2, 2e-2), "fp8mma": (5e-2, 2e-2)}
QK_LOOSE = (8e-2, 0.25)
LOOSE = {"fp8qk": QK_LOOSE, "fp8mma": (1e-1, 0.25)}  # against the unquantised reference
QUANTISED_Q = ("fp8qk", "fp8mma")  # the kinds whose Q the kernel rounds to e4m3


@pytest.fixture(scope="module", autouse=True)
def built():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"sm_90 only; this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    ok, why = sm90.availability()
    if not ok:
        pytest.skip(why)
    try:
        return sm90.load_extension()
    except sm90.BuildError as e:  # on an H100 / H200 a failed build is a failure, not a skip
        pytest.fail(str(e)[-6000:], pytrace=False)


def _check(out, lse, ref, ref_lse, tag, kind="bf16"):
    err = rel_err(out, ref)
    abs_err = (out.double() - ref.double()).abs().max().item()
    lse_err = (lse - ref_lse).abs().max().item()
    print(f"sm90 {kind} {tag}: rel {err:.2e} max abs {abs_err:.2e} lse max abs {lse_err:.2e}")
    rel_bound, lse_bound = LOOSE[kind] if tag.startswith("unquantised") else BOUNDS[kind]
    assert err < rel_bound, (tag, err, abs_err)
    torch.testing.assert_close(lse, ref_lse, atol=lse_bound, rtol=1e-3)


def _poison_tails(cache, page_table, lens, page_size):
    """NaN in the slots past each request's last key in its last page: a kernel must not use them."""
    for b, n in enumerate(lens):
        if n % page_size:
            page, tail = page_table[b, (n - 1) // page_size].long(), slice(n % page_size, None)
            if cache.kind == "bf16":
                cache.packed[page, tail] = float("nan")
            else:
                cache.latent.view(torch.uint8)[page, tail] = 0x7F  # e4m3 NaN
                cache.scale[page, tail] = float("nan")
                cache.rope[page, tail] = float("nan")


def _reference_checks(q, cache, page_table, lens, qsl, out, lse, kind, tag, unquantised=True):
    """Against the reference; for the e4m3-score kinds first on Q quantised as the kernel does it, then
    (unless unquantised=False) loosely on the true Q."""
    dev_lens = torch.tensor(lens, device=DEV)
    if kind in QUANTISED_Q:
        ref, ref_lse = mla_decode_reference(quantize_q_latent_e4m3(q), cache, page_table, dev_lens, qsl, SCALE)
        _check(out, lse, ref, ref_lse, tag, kind)
        if not unquantised:
            return
        tag = "unquantised " + tag
    ref, ref_lse = mla_decode_reference(q, cache, page_table, dev_lens, qsl, SCALE)
    _check(out, lse, ref, ref_lse, tag, kind)


def _cache_kind(kind):
    return "bf16" if kind == "bf16" else "fp8"


def _variant(kind):
    """The run() flags of a test kind."""
    return {"fp8_scores": kind in QUANTISED_Q, "fp8_pv": kind == "fp8mma"}


def _case(page_size, lens, q_len, heads, seed=0, num_splits=None, nan_tails=False, kind="bf16"):
    g = torch.Generator().manual_seed(seed)
    cache, page_table = make_paged_cache(_cache_kind(kind), page_size, lens, device=DEV, generator=g)
    if nan_tails:
        _poison_tails(cache, page_table, lens, page_size)
    qsl = query_start([q_len] * len(lens))
    q = torch.randn(int(qsl[-1]), heads, 576, generator=g).to(DEV, torch.bfloat16)
    out, lse = sm90.mla_decode_sm90(q, cache, page_table, torch.tensor(lens), qsl, SCALE, return_lse=True,
                                    num_splits=num_splits, **_variant(kind))
    _reference_checks(q, cache, page_table, lens, qsl, out, lse, kind,
                      f"page {page_size} q_len {q_len} heads {heads} lens {lens} splits {num_splits}")


@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("q_len", [1, 2, 4, 16])
def test_pages_and_spec_tokens(page_size, q_len):
    lens = [q_len, page_size - 1 if page_size - 1 >= q_len else page_size, page_size, page_size + 1,
            3 * page_size - 1, 1000 + q_len]
    _case(page_size, lens, q_len, 16, seed=q_len)


@pytest.mark.parametrize("heads,q_len", [(16, 4), (32, 2), (32, 3), (64, 1), (128, 1), (128, 8), (16, 16)])
def test_heads(heads, q_len):
    _case(64, [700, 2049, 63, 65], q_len, heads, seed=heads)


def test_long_lengths():
    _case(64, [1, 63, 64, 65, 81920], 1, 16, seed=4)
    _case(64, [4, 63, 4097, 81919, 81920], 4, 16, seed=5)
    _case(32, [81920, 30001], 16, 16, seed=6)
    _case(64, [81920, 30000], 8, 128, seed=7)


@pytest.mark.parametrize("num_splits", [1, 2, 7, 64])
def test_split_counts(num_splits):
    _case(64, [5000, 300, 17, 129], 2, 16, seed=num_splits, num_splits=num_splits)


@pytest.mark.parametrize("page_size", [16, 64])
def test_nan_in_page_tails_is_never_read(page_size):
    _case(page_size, [4, 63, 65, 1000, 4097], 4, 16, seed=9, nan_tails=True)
    _case(page_size, [1, 63, 65, 1000, 4097], 1, 16, seed=10, num_splits=3, nan_tails=True)


def test_empty_batch_and_the_registry_path():
    import lightspeed_kernel as lk

    impl = lk.select_kernel("mla", "decode", torch.bfloat16, platform=lk.Platform.parse("sm_90"),
                            traits={"page_size": 64, "kv_dtype": "bf16"}, override=sm90.KERNEL_NAME).impl
    cache, table = make_paged_cache("bf16", 64, [10], device=DEV)
    q = torch.empty(0, 16, 576, device=DEV, dtype=torch.bfloat16)
    out = impl(q, cache, table[:0], torch.zeros(0, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), SCALE)
    assert out.shape == (0, 16, 512)


def _graph_case(num_splits, kind):
    torch.manual_seed(0)
    H, q_len, lens = 16, 4, [3000, 9000, 40, 20000]
    cache, page_table = make_paged_cache(_cache_kind(kind), 64, [n + 64 for n in lens], device=DEV)
    B = len(lens)
    qsl = query_start([q_len] * B)
    T = B * q_len
    ws = torch.empty(decode_workspace_bytes(B, T, H, 16), dtype=torch.uint8, device=DEV)
    plan = sm90.plan(ws, qsl, lens, H, page_size=64, softmax_scale=SCALE, num_splits=num_splits,
                     cache_kind=cache.kind)
    q = torch.randn(T, H, 576, device=DEV).to(torch.bfloat16)
    out = torch.empty(T, H, 512, device=DEV, dtype=torch.bfloat16)
    lse = torch.empty(T, H, device=DEV)
    sm90.run(plan, q, cache, page_table, out, lse, **_variant(kind))  # build and compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sm90.run(plan, q, cache, page_table, out, lse, **_variant(kind))
    for step in (1, 2, 63):  # later steps: longer, same plan shape; the graph reads the new lengths
        new_lens = [n + step for n in lens]
        sm90.plan(ws, qsl, new_lens, H, page_size=64, softmax_scale=SCALE, num_splits=num_splits,
                  cache_kind=cache.kind)
        q.copy_(torch.randn_like(q, dtype=torch.float32))
        out.fill_(float("nan"))
        graph.replay()
        _reference_checks(q, cache, page_table, new_lens, qsl, out, lse, kind, f"graph splits {num_splits} step {step}")


def _triton_case(kind):
    from lightspeed_mla import mla_decode

    g = torch.Generator().manual_seed(11)
    lens = [81920] * 4
    cache, table = make_paged_cache(_cache_kind(kind), 64, lens, device=DEV, generator=g)
    qsl = query_start([4] * 4)
    q = torch.randn(16, 16, 576, generator=g).to(DEV, torch.bfloat16)
    ours = sm90.mla_decode_sm90(q, cache, table, torch.tensor(lens), qsl, SCALE, **_variant(kind))
    theirs = mla_decode(q, cache, table, torch.tensor(lens), qsl, SCALE)
    err = rel_err(ours, theirs)
    print(f"sm90 {kind} vs triton, seeds' case batch 4: rel {err:.2e}")
    assert err < (LOOSE[kind][0] if kind in LOOSE else 1e-2)


@pytest.mark.parametrize("num_splits", [1, 16])
def test_plan_run_under_cuda_graph(num_splits):
    _graph_case(num_splits, "bf16")


def test_agrees_with_the_triton_kernel_on_the_seeds_case():
    _triton_case("bf16")


# ---- the FP8 cache (after every bf16 test: with -x a failure here leaves the bf16 results standing) ----


@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("q_len", [1, 4, 16])
def test_fp8_pages_and_spec_tokens(page_size, q_len):
    lens = [q_len, page_size, page_size + 1, 3 * page_size - 1, 1000 + q_len]
    _case(page_size, lens, q_len, 16, seed=q_len, kind="fp8")


@pytest.mark.parametrize("heads,q_len", [(16, 4), (32, 2), (64, 1), (128, 1), (128, 8)])
def test_fp8_heads(heads, q_len):
    _case(64, [700, 2049, 63, 65], q_len, heads, seed=heads, kind="fp8")


def _long_cases(kind):
    _case(64, [1, 63, 64, 65, 81920], 1, 16, seed=4, kind=kind)
    _case(64, [4, 63, 4097, 81919, 81920], 4, 16, seed=5, kind=kind)
    _case(64, [81920, 30000], 8, 128, seed=7, kind=kind)
    for num_splits in (1, 7, 64):
        _case(64, [5000, 300, 17, 129], 2, 16, seed=num_splits, num_splits=num_splits, kind=kind)
    _case(16, [4, 63, 65, 1000, 4097], 4, 16, seed=9, nan_tails=True, kind=kind)
    _case(64, [4, 63, 65, 1000, 4097], 1, 16, seed=10, num_splits=3, nan_tails=True, kind=kind)


def test_fp8_long_lengths_splits_and_nan_tails():
    _long_cases("fp8")


@pytest.mark.parametrize("num_splits", [1, 16])
def test_fp8_plan_run_under_cuda_graph(num_splits):
    _graph_case(num_splits, "fp8")


def test_fp8_agrees_with_the_triton_kernel_on_the_seeds_case():
    _triton_case("fp8")


# ---- the e4m3-scores variant (mla_decode_sm90_fp8qk) ----


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("q_len", [1, 4])
def test_fp8qk_pages_and_spec_tokens(page_size, q_len):
    lens = [q_len, page_size, page_size + 1, 3 * page_size - 1, 1000 + q_len]
    _case(page_size, lens, q_len, 16, seed=q_len, kind="fp8qk")


@pytest.mark.parametrize("heads,q_len", [(32, 2), (128, 1)])
def test_fp8qk_heads(heads, q_len):
    _case(64, [700, 2049, 63, 65], q_len, heads, seed=heads, kind="fp8qk")


def test_fp8qk_long_lengths_splits_and_nan_tails():
    _long_cases("fp8qk")


def test_fp8qk_plan_run_under_cuda_graph():
    _graph_case(16, "fp8qk")


def test_fp8qk_agrees_with_the_triton_kernel_on_the_seeds_case():
    _triton_case("fp8qk")


# ---- the all-e4m3 variant (mla_decode_sm90_fp8mma; last: unmeasured, a failure leaves the rest standing) ----


@pytest.mark.parametrize("page_size", [8, 16, 64, 128])
@pytest.mark.parametrize("q_len", [1, 4])
def test_fp8mma_pages_and_spec_tokens(page_size, q_len):
    lens = [q_len, page_size, page_size + 1, 3 * page_size - 1, 1000 + q_len]
    _case(page_size, lens, q_len, 16, seed=q_len, kind="fp8mma")


@pytest.mark.parametrize("heads,q_len", [(32, 2), (64, 1), (128, 1), (16, 16)])
def test_fp8mma_heads(heads, q_len):
    _case(64, [700, 2049, 63, 65], q_len, heads, seed=heads, kind="fp8mma")


def test_fp8mma_long_lengths_splits_and_nan_tails():
    _long_cases("fp8mma")


def test_fp8mma_a_tile_of_tiny_and_zero_scales():
    """The per-tile P multiplier c = 256 / max k_scale: a tile of zero scales (c = 1, P' = 0) and scales
    spread over 30 binades must still give the reference."""
    g = torch.Generator().manual_seed(12)
    lens = [640, 200]
    cache, table = make_paged_cache("fp8", 64, lens, device=DEV, generator=g)
    flat = cache.scale.view(-1)
    flat[table[0, 2].long() * 64:(table[0, 2].long() + 1) * 64] = 0.0  # request 0's third page: all zero
    spread = torch.logspace(-20, 5, 64, base=2.0, device=DEV)
    flat[table[1, 0].long() * 64:(table[1, 0].long() + 1) * 64] = spread
    qsl = query_start([4, 4])
    q = torch.randn(8, 16, 576, generator=g).to(DEV, torch.bfloat16)
    out, lse = sm90.mla_decode_sm90(q, cache, table, torch.tensor(lens), qsl, SCALE, return_lse=True,
                                    **_variant("fp8mma"))
    # Scales up to 32 put this tile's scores in the thousands, where Q's e4m3 rounding moves them by tens
    # and reorders the softmax: the distance from the unquantised reference says nothing about c here.
    _reference_checks(q, cache, table, lens, qsl, out, lse, "fp8mma", "zero and spread scales", unquantised=False)


def test_fp8mma_plan_run_under_cuda_graph():
    _graph_case(16, "fp8mma")


def test_fp8mma_agrees_with_the_triton_kernel_on_the_seeds_case():
    _triton_case("fp8mma")
