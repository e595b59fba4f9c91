import pytest
import torch
from lightspeed_kernel.reference import kv_store as ref_kv
from lightspeed_kernel.reference import rope as ref_rope
from lightspeed_kernel.triton import kv_store, rope
from tk_helpers import TOL, assert_fp8_codes_match, rel_err

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    "t,hq,hkv,d,rot", [(0, 2, 1, 16, 16), (1, 1, 1, 8, 8), (5, 4, 2, 32, 32), (3, 3, 1, 64, 16)]
)
def test_rope_matches_reference(device, dtype, is_neox, t, hq, hkv, d, rot):
    cache = ref_rope.rope_cos_sin_cache(rot, 64, 10000.0, device=device)
    pos = torch.randint(0, 64, (t,), device=device)
    # q as a strided view of a fused qkv projection, as models produce it
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=device).to(dtype)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache, is_neox=is_neox)
    gq, gk = rope.apply_rope(pos, q, k, cache, is_neox=is_neox)
    assert gq is q and gk is k
    if t:
        assert rel_err(gq, rq) < TOL[dtype] and rel_err(gk, rk) < TOL[dtype]
        assert torch.equal(gq[..., rot:], rq[..., rot:])  # features past rot_dim untouched


def test_rope_llama3_scaled_cache(device):
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    cache = ref_rope.rope_cos_sin_cache(32, 256, 500000.0, scaling, device=device)
    pos = torch.tensor([0, 1, 255, 100], device=device)
    q, k = torch.randn(4, 2, 32, device=device), torch.randn(4, 1, 32, device=device)
    rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache)
    gq, gk = rope.apply_rope(pos, q, k, cache)
    assert rel_err(gq, rq) < 1e-5 and rel_err(gk, rk) < 1e-5


def _slots(t, num_pages, page_size, skip=()):
    # distinct slots over pages 1.. (page 0 is padding), some tokens skipped with -1
    slots = torch.randperm((num_pages - 1) * page_size)[:t] + page_size
    for i in skip:
        slots[i] = -1
    return slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("t,skip", [(0, ()), (1, ()), (7, (2,)), (40, (0, 39))])
def test_store_kv_matches_reference(device, dtype, page_size, t, skip):
    hkv, d, pages = 2, 32, 4
    k, v = torch.randn(t, hkv, d).to(dtype), torch.randn(t, hkv, d).to(dtype)
    slots = _slots(t, pages, page_size, skip)
    kc, vc = torch.randn(pages, page_size, hkv, d).to(dtype), torch.randn(pages, page_size, hkv, d).to(dtype)
    rkc, rvc = kc.clone(), vc.clone()
    ref_kv.store_kv(k, v, rkc, rvc, slots)
    kc, vc = kc.to(device), vc.to(device)
    kv_store.store_kv(k.to(device), v.to(device), kc, vc, slots.to(device))
    assert torch.equal(kc.cpu(), rkc) and torch.equal(vc.cpu(), rvc)


@pytest.mark.parametrize("tokens_per_program", [1, 3])
def test_store_kv_tokens_per_program(device, tokens_per_program):
    # a program handling several tokens, with a ragged last program and a skipped token
    k, v = torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    slots = _slots(7, 3, 16, (5,))
    kc, vc = torch.randn(3, 16, 2, 16), torch.randn(3, 16, 2, 16)
    rkc, rvc = kc.clone(), vc.clone()
    ref_kv.store_kv(k, v, rkc, rvc, slots)
    kc, vc = kc.to(device), vc.to(device)
    kv_store.store_kv(
        k.to(device), v.to(device), kc, vc, slots.to(device), _tokens_per_program=tokens_per_program
    )
    assert torch.equal(kc.cpu(), rkc) and torch.equal(vc.cpu(), rvc)


@pytest.mark.parametrize("page_size", [16, 64])
def test_store_kv_fp8_with_scale(device, page_size):
    t, hkv, d, pages = 9, 2, 16, 3
    k, v = torch.randn(t, hkv, d, device=device), torch.randn(t, hkv, d, device=device)
    slots = _slots(t, pages, page_size, (4,)).to(device)
    kc = torch.zeros(pages, page_size, hkv, d, device=device).to(torch.float8_e4m3fn)
    vc = kc.clone()
    rkc, rvc = kc.clone(), vc.clone()
    ref_kv.store_kv(k, v, rkc, rvc, slots, k_scale=0.05, v_scale=torch.tensor(0.1, device=device))
    kv_store.store_kv(k, v, kc, vc, slots, k_scale=0.05, v_scale=torch.tensor(0.1, device=device))
    assert_fp8_codes_match(kc, rkc)
    assert_fp8_codes_match(vc, rvc)


@pytest.mark.gpu
def test_rope_kv_store_gpu_sizes():
    t = 8192
    cache = ref_rope.rope_cos_sin_cache(128, 131072, 500000.0, device="cuda")
    pos = torch.randint(0, 131072, (t,), device="cuda")
    q = torch.randn(t, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, 8, 128, device="cuda", dtype=torch.bfloat16)
    rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache)
    rope.apply_rope(pos, q, k, cache)
    assert rel_err(q, rq) < TOL[torch.bfloat16] and rel_err(k, rk) < TOL[torch.bfloat16]
    pages = 1024
    kc = torch.zeros(pages, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = torch.randperm((pages - 1) * 16, device="cuda")[:t] + 16
    rkc, rvc = kc.clone(), vc.clone()
    ref_kv.store_kv(k, k, rkc, rvc, slots)
    kv_store.store_kv(k, k, kc, vc, slots)
    assert torch.equal(kc, rkc) and torch.equal(vc, rvc)


def _fused_case(device, dtype, t, hq, hkv, d, rot, page_size=16, pages=4, skip=()):
    """q, k, v as strided views of one fused qkv projection (as models produce them), slots, caches."""
    cache = ref_rope.rope_cos_sin_cache(rot, 64, 10000.0, device=device)
    pos = torch.randint(0, 64, (t,), device=device)
    qkv = torch.randn(t, (hq + 2 * hkv) * d, device=device).to(dtype)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    slots = _slots(t, pages, page_size, skip).to(device)
    kc = torch.randn(pages, page_size, hkv, d, device=device).to(dtype)
    return pos, q, k, v, cache, kc, torch.randn_like(kc), slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(
    "t,hq,hkv,d,rot,skip",
    [(0, 2, 1, 16, 16, ()), (1, 1, 1, 8, 8, ()), (5, 4, 2, 32, 32, (1,)), (3, 3, 1, 64, 16, ()), (6, 8, 2, 24, 24, (0, 5))],
)
def test_rope_store_kv_matches_rope_then_store(device, dtype, is_neox, t, hq, hkv, d, rot, skip):
    """The fused op against its definition (apply_rope then store_kv): partial rotary, a head dim that
    is not a power of two (24), skipped slots, GQA."""
    pos, q, k, v, cache, kc, vc, slots = _fused_case(device, dtype, t, hq, hkv, d, rot, skip=skip)
    rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache, is_neox=is_neox)
    rkc, rvc = kc.clone(), vc.clone()
    ref_kv.store_kv(rk, v, rkc, rvc, slots)
    got = kv_store.rope_store_kv(pos, q, k, v, cache, kc, vc, slots, is_neox=is_neox)
    assert got is q
    if t:
        assert rel_err(q, rq) < TOL[dtype]
        assert rel_err(kc, rkc) < TOL[dtype] and torch.equal(vc, rvc)
    assert torch.equal(kc[:, :, :, rot:], rkc[:, :, :, rot:])  # features past rot_dim copied as they are
    untouched = torch.ones(kc.shape[:2], dtype=torch.bool, device=device).flatten()
    untouched[slots[slots >= 0]] = False
    assert torch.equal(kc.flatten(0, 1)[untouched], rkc.flatten(0, 1)[untouched])


@pytest.mark.parametrize("is_neox", [True, False])
def test_rope_store_kv_fp8_with_scale(device, is_neox):
    pos, q, k, v, cache, _, _, slots = _fused_case(device, torch.float32, 9, 4, 2, 16, 16, skip=(4,))
    kc = torch.zeros(4, 16, 2, 16, device=device).to(torch.float8_e4m3fn)
    vc, rkc, rvc = kc.clone(), kc.clone(), kc.clone()
    rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache, is_neox=is_neox)
    ref_kv.store_kv(rk, v, rkc, rvc, slots, k_scale=0.05, v_scale=torch.tensor(0.1, device=device))
    kv_store.rope_store_kv(pos, q, k, v, cache, kc, vc, slots, is_neox=is_neox, k_scale=0.05,
                           v_scale=torch.tensor(0.1, device=device))
    assert rel_err(q, rq) < TOL[torch.float32]
    assert_fp8_codes_match(kc, rkc)
    assert_fp8_codes_match(vc, rvc)


def test_rope_store_kv_public_op_definition_on_cpu():
    """The public op on CPU tensors runs the composite (apply_rope then store_kv) and leaves k rotated."""
    from lightspeed_kernel import ops

    pos, q, k, v, cache, kc, vc, slots = _fused_case("cpu", torch.float32, 5, 4, 2, 16, 16)
    rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache)
    rkc, rvc = kc.clone(), vc.clone()
    ref_kv.store_kv(rk, v, rkc, rvc, slots)
    got = ops.rope_store_kv(pos, q, k, v, cache, kc, vc, slots)
    assert torch.allclose(got, rq, atol=1e-6) and torch.allclose(kc, rkc, atol=1e-6) and torch.equal(vc, rvc)


@pytest.mark.gpu
def test_rope_store_kv_gpu_sizes():
    """The Llama-3-8B decode and prefill shapes on the GPU, bf16, against rope then store."""
    for t in (1, 64, 8192):
        cache = ref_rope.rope_cos_sin_cache(128, 131072, 500000.0, device="cuda")
        pos = torch.randint(0, 131072, (t,), device="cuda")
        qkv = torch.randn(t, 48 * 128, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv[:, :4096].view(t, 32, 128), qkv[:, 4096:5120].view(t, 8, 128), qkv[:, 5120:].view(t, 8, 128)
        rq, rk = ref_rope.apply_rope(pos, q.clone(), k.clone(), cache)
        kc = torch.zeros(1024, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
        vc, rkc, rvc = torch.zeros_like(kc), kc.clone(), kc.clone()
        slots = torch.randperm(1023 * 16, device="cuda")[:t] + 16
        ref_kv.store_kv(rk, v, rkc, rvc, slots)
        kv_store.rope_store_kv(pos, q, k, v, cache, kc, vc, slots)
        assert rel_err(q, rq) < TOL[torch.bfloat16] and rel_err(kc, rkc) < TOL[torch.bfloat16]
        assert torch.equal(vc, rvc)
