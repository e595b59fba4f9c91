import pytest
import torch
from lightspeed_mla import MLACache, pack_kv, pack_kv_reference, quantize_latent_fp8


def _poisoned(kind, pages=4, page_size=16):
    cache = MLACache.empty(pages, page_size, kind)
    cache.rope.fill_(-7.0)
    if kind == "bf16":
        cache.latent.fill_(-7.0)
    else:
        cache.latent.copy_(torch.full(cache.latent.shape, -7.0).to(torch.float8_e4m3fn))
        cache.scale.fill_(-7.0)
    return cache


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
@pytest.mark.parametrize("page_size", [16, 64])
def test_pack_kv_matches_reference_and_skips_padding(kind, page_size):
    torch.manual_seed(0)
    T = 9
    latent, rope = torch.randn(T, 512) * 3, torch.randn(T, 64)
    slots = torch.tensor([0, page_size - 1, page_size, 2 * page_size + 3, -1, 3 * page_size - 1, 1, -1, 5])
    got, want = _poisoned(kind, page_size=page_size), _poisoned(kind, page_size=page_size)
    pack_kv(latent, rope, slots, got)
    pack_kv_reference(latent, rope, slots, want)
    g_lat, g_rope = got.dequantized()
    w_lat, w_rope = want.dequantized()
    written = torch.zeros(4 * page_size, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    written = written.view(4, page_size)
    # Untouched slots keep the poison.
    assert (g_rope[~written] == -7.0).all()
    # bf16 round-to-nearest in both (the interpreter may round the other way on ties: 1 ulp).
    torch.testing.assert_close(g_rope[written], w_rope[written], rtol=1e-2, atol=1e-2)
    keep = slots >= 0
    stored = g_lat.view(-1, 512)[slots[keep]]  # token order
    tol = 1e-2 if kind == "bf16" else 0.07
    assert ((stored - latent[keep]).norm() / latent[keep].norm()) < tol
    torch.testing.assert_close(g_rope.view(-1, 64)[slots[keep]], rope[keep], rtol=1e-2, atol=1e-2)
    if kind == "fp8":
        amax = latent[keep].abs().amax(-1)
        torch.testing.assert_close(got.scale.view(-1)[slots[keep]], amax / 448.0, rtol=1e-5, atol=0)


def test_quantize_latent_fp8_round_trip():
    x = torch.randn(32, 512) * torch.logspace(-3, 3, 32)[:, None]
    q, s = quantize_latent_fp8(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (32, 1)
    rel = ((q.float() * s - x).norm(dim=-1) / x.norm(dim=-1)).max()
    assert rel < 0.07  # e4m3: 3 mantissa bits, per-token scale keeps every token in range


def test_cache_formats_and_validation():
    c = MLACache.empty(3, 64, "bf16")
    assert c.packed.shape == (3, 64, 576) and c.latent.data_ptr() == c.packed.data_ptr()
    assert c.bytes_per_token == 1152
    f = MLACache.empty(3, 64, "fp8")
    assert f.latent.dtype == torch.float8_e4m3fn and f.scale.shape == (3, 64, 1) and f.rope.dtype == torch.bfloat16
    assert f.bytes_per_token == 644
    with pytest.raises(ValueError):
        MLACache.empty(3, 64, "int8")
    with pytest.raises(ValueError):
        MLACache.from_packed(torch.zeros(3, 64, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        pack_kv(torch.zeros(2, 256), torch.zeros(2, 64), torch.zeros(2, dtype=torch.int64), c)
