"""The FP8_MMA path of the absorbed kernel (e4m3 MMAs on the FP8 cache) against the reference.

Tolerances. Q's latent is rounded to e4m3 per row and P per tile per row; the cache's latent is e4m3
already (the reference dequantises the same values). e4m3 keeps 3 mantissa bits: a rounding error
of at most 2^-4 relative, ~2.5% rms. Q's share perturbs each logit by ~2.5% of its spread, which
moves the output (measured ~0.9%) and the LSE (up to ~0.04 on a row with one key, where the LSE is
that one logit). P's share only weights the values (l, the softmax denominator, sums unrounded P,
so the LSE does not see it): ~0.7% on the output. Hence two checks per case:
* against ``mla_decode_reference``: out rel. error < 3e-2, LSE within 0.1;
* against the reference on Q rounded as the kernel rounds it (``quantize_q_latent_e4m3``), which
  leaves P's rounding alone: out rel. error < 2e-2, LSE within 1e-2 (fp32 summation order; the
  helper rounds with the kernel's own fp32 arithmetic, so ties land alike).
"""

import pytest
import torch
from lightspeed_mla import mla_decode, mla_decode_reference, plan_decode
from lightspeed_mla.tuning import DecodeTile, decode_tile
from mla_helpers import make_paged_cache, quantize_q_latent_e4m3, query_start, rel_err

SCALE = 576 ** -0.5


def _check(page_size, lens, q_lens, heads, tile=None, spread_scales=False, **overrides):
    g = torch.Generator().manual_seed(len(lens) * 1000 + sum(lens) + heads)
    cache, page_table = make_paged_cache("fp8", page_size, lens, generator=g)
    if spread_scales:
        # Key scales over ~2 decades: P·K's per-token scales differ within a tile. The logits grow
        # with them, and Q's rounding error with the logits (2.5% of a logit: ~0.6 on the LSE here),
        # so only the Q-rounded reference is a fair yardstick.
        cache.scale.mul_(torch.exp(torch.randn(cache.scale.shape, generator=g)))
    qsl = query_start(q_lens)
    q = torch.randn(int(qsl[-1]), heads, 576, generator=g).to(torch.bfloat16)
    tile = tile or DecodeTile(16, 16, 4, 1, False, 1, True)
    out, lse = mla_decode(q, cache, page_table, torch.tensor(lens), qsl, SCALE, return_lse=True,
                          tile=tile, **overrides)
    if not spread_scales:
        ref, ref_lse = mla_decode_reference(q, cache, page_table, torch.tensor(lens), qsl, SCALE)
        assert rel_err(out, ref) < 3e-2
        torch.testing.assert_close(lse, ref_lse, atol=0.1, rtol=0)
    ref_q8, ref_q8_lse = mla_decode_reference(quantize_q_latent_e4m3(q), cache, page_table, torch.tensor(lens), qsl,
                                              SCALE)
    assert rel_err(out, ref_q8) < 2e-2
    torch.testing.assert_close(lse, ref_q8_lse, atol=1e-2, rtol=0)


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_fp8_mma_page_boundaries(page_size, swap_ab):
    lens = [1, page_size, page_size + 1, 2 * page_size - 1]
    _check(page_size, lens, [1] * len(lens), 8, tile=DecodeTile(16, 16, 4, 1, swap_ab, 1, True))


@pytest.mark.parametrize("q_len", [1, 2, 3, 4])
def test_fp8_mma_spec_tokens_folded(q_len):
    # 16 heads x q_len folded into 16-row tiles; lengths off the 16-key tile, one as short as q_len.
    _check(16, [q_len, q_len + 37, 77], [q_len] * 3, 16, fold=True)


@pytest.mark.parametrize("num_splits", [2, 5])
@pytest.mark.parametrize("swap_ab", [False, True])
def test_fp8_mma_splits(num_splits, swap_ab):
    # Splits shorter than a request's tail and splits a short request leaves empty.
    _check(16, [90, 7, 1], [2, 2, 1], 16, tile=DecodeTile(16, 16, 4, 1, swap_ab, 1, True), num_splits=num_splits)


def test_fp8_mma_key_scales_spread():
    _check(64, [150, 3], [4, 1], 8, spread_scales=True, fold=True, num_splits=2)


def test_fp8_mma_unfolded_several_row_tiles():
    _check(32, [50, 33], [3, 2], 24, fold=False)


def test_fp8_mma_plan_override():
    # plan_decode(fp8_mma=True) flips the flag on the table's tile; bf16 caches refuse it.
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    plan = plan_decode(ws, [0, 1], [5], 8, page_size=16, softmax_scale=1.0, cache_kind="fp8", fp8_mma=True)
    assert plan.tile.fp8_mma
    with pytest.raises(ValueError):
        plan_decode(ws, [0, 1], [5], 8, page_size=16, softmax_scale=1.0, cache_kind="bf16", fp8_mma=True)



def test_default_tiles_keep_the_bf16_mma_path():
    # Until the H200 has timed FP8_MMA, no table row turns it on (tuning.py).
    for arch in (9, 10):
        for rows in (16, 32, 64):
            assert not decode_tile(arch, "fp8", rows).fp8_mma
    assert decode_tile(None, "fp8", 64).fp8_mma is False
