import pytest
import torch
from lightspeed_mla import mla_decode, mla_decode_reference, mla_prefill_reference
from lightspeed_mla.prefill import choose_prefill_form, gather_latent, mla_prefill
from lightspeed_mla.reference import gather_latent_reference
from lightspeed_mla.tuning import PrefillTile
from mla_helpers import make_paged_cache, query_start, rel_err

SCALE = 192 ** -0.5


def _inputs(q_lens, kv_lens, heads, g):
    T, Tk = sum(q_lens), sum(kv_lens)
    q_nope = torch.randn(T, heads, 128, generator=g).to(torch.bfloat16)
    q_rope = torch.randn(T, heads, 64, generator=g).to(torch.bfloat16)
    k_nope = torch.randn(Tk, heads, 128, generator=g).to(torch.bfloat16)
    k_rope = torch.randn(Tk, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(Tk, heads, 128, generator=g).to(torch.bfloat16)
    return q_nope, q_rope, k_nope, k_rope, v


@pytest.mark.parametrize(
    "q_lens,kv_lens",
    [
        ([1], [1]),  # length 1
        ([37], [37]),  # no prefix: plain causal, partial blocks
        ([5, 17, 0, 33], [5, 40, 10, 70]),  # ragged, prefixes, a request with no new tokens
        ([16, 1], [16, 49]),  # block-aligned diagonal; one token over a prefix
    ],
)
def test_prefill_matches_reference(q_lens, kv_lens):
    g = torch.Generator().manual_seed(sum(q_lens) + 7 * sum(kv_lens))
    heads = 2
    args = _inputs(q_lens, kv_lens, heads, g)
    cu_q, cu_k = query_start(q_lens), query_start(kv_lens)
    lse = torch.full((sum(q_lens), heads), float("nan"))
    out = mla_prefill(*args, cu_q, cu_k, max(q_lens), SCALE, lse=lse, tile=PrefillTile(16, 16, 4, 1))
    ref, ref_lse = mla_prefill_reference(*args, cu_q, cu_k, SCALE)
    assert rel_err(out, ref) < 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_gather_latent_matches_reference(kind):
    lens = [5, 40, 17]
    cache, page_table = make_paged_cache(kind, 16, lens)
    latent, rope = gather_latent(cache, page_table, torch.tensor(lens))
    cu = query_start(lens)
    for b, n in enumerate(lens):
        ref_lat, ref_rope = gather_latent_reference(cache, page_table[b], n)
        torch.testing.assert_close(latent[cu[b]:cu[b + 1]].float(), ref_lat, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(rope[cu[b]:cu[b + 1]].float(), ref_rope)


def test_absorbed_and_non_absorbed_forms_agree():
    # The two forms are one function: q_nope·(W_uk c) = (q_nope W_uk)·c and P (W_uv c) = W_uv (P c).
    g = torch.Generator().manual_seed(3)
    heads, q_lens, kv_lens = 2, [3, 6], [20, 6]
    cache, page_table = make_paged_cache("bf16", 16, kv_lens, generator=g)
    w_uk = torch.randn(heads, 128, 512, generator=g) / 512 ** 0.5  # latent -> per-head no-rope key
    w_uv = torch.randn(heads, 128, 512, generator=g) / 512 ** 0.5  # latent -> per-head value
    latent, rope = gather_latent(cache, page_table, torch.tensor(kv_lens))
    k_nope = torch.einsum("lc,hdc->lhd", latent.float(), w_uk).to(torch.bfloat16)
    v = torch.einsum("lc,hdc->lhd", latent.float(), w_uv).to(torch.bfloat16)
    T = sum(q_lens)
    q_nope = torch.randn(T, heads, 128, generator=g)
    q_rope = torch.randn(T, heads, 64, generator=g)
    cu_q, cu_k = query_start(q_lens), query_start(kv_lens)
    plain = mla_prefill(q_nope.bfloat16(), q_rope.bfloat16(), k_nope, rope, v, cu_q, cu_k, max(q_lens), SCALE,
                        tile=PrefillTile(16, 16, 4, 1))
    q_abs = torch.cat([torch.einsum("thd,hdc->thc", q_nope, w_uk), q_rope], -1).to(torch.bfloat16)
    out_lat = mla_decode(q_abs, cache, page_table, torch.tensor(kv_lens), cu_q, SCALE)
    absorbed = torch.einsum("thc,hdc->thd", out_lat.float(), w_uv)
    ref_lat, _ = mla_decode_reference(q_abs, cache, page_table, torch.tensor(kv_lens), cu_q, SCALE)
    assert rel_err(out_lat, ref_lat) < 1e-2
    assert rel_err(plain, absorbed) < 3e-2  # bf16 k_nope / v / q_abs rounding on each side


def test_choose_prefill_form():
    # Speculative verify / short extends over a long prefix: absorbed. Long prompts: non-absorbed.
    assert choose_prefill_form([4], [8192], 128) == "absorbed"
    assert choose_prefill_form([64], [32768], 16) == "absorbed"
    assert choose_prefill_form([8192], [8192], 128) == "non_absorbed"
    assert choose_prefill_form([2048], [10240], 16) == "non_absorbed"


def test_prefill_validates_shapes():
    z = torch.zeros(2, 2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        mla_prefill(z, z, z, torch.zeros(2, 64, dtype=torch.bfloat16), z, torch.tensor([0, 2]), torch.tensor([0, 2]),
                    2, 1.0)
