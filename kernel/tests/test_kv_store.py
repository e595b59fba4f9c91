import pytest
import torch
from lightspeed_kernel import ops

from .paged_helpers import build_batch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("q_lens", [[], [1], [16, 1, 65], [64, 3]])
def test_store_by_slot(dtype, page_size, q_lens):
    batch = build_batch([0] * len(q_lens), q_lens, page_size, 2, 32, dtype)
    k, v = torch.cat(batch["k_seq"]) if q_lens else torch.zeros(0, 2, 32, dtype=dtype), None
    v = torch.cat(batch["v_seq"]) if q_lens else torch.zeros(0, 2, 32, dtype=dtype)
    k_cache = torch.zeros(batch["cache_shape"], dtype=dtype)
    v_cache = torch.zeros(batch["cache_shape"], dtype=dtype)
    assert ops.store_kv(k, v, k_cache, v_cache, batch["slot_mapping"]) is None
    for b, slots in enumerate(batch["seq_slots"]):
        pages, offsets = slots // page_size, slots % page_size
        assert torch.equal(k_cache[pages, offsets], batch["k_seq"][b])
        assert torch.equal(v_cache[pages, offsets], batch["v_seq"][b])
    assert k_cache[0].eq(0).all()  # the padding page is never written
    written = k_cache.abs().sum(dim=(-1, -2)).ne(0).sum().item()
    assert written == sum(q_lens)


def test_minus_one_skips():
    k = torch.randn(4, 1, 8)
    k_cache = torch.zeros(3, 4, 1, 8)
    v_cache = torch.zeros(3, 4, 1, 8)
    slots = torch.tensor([4, -1, 11, -1])
    ops.store_kv(k, -k, k_cache, v_cache, slots)
    assert torch.equal(k_cache[1, 0], k[0]) and torch.equal(k_cache[2, 3], k[2])
    assert torch.equal(v_cache[2, 3], -k[2])
    assert k_cache.ne(0).any(-1).sum().item() == 2


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_with_scale(fp8):
    k = torch.randn(5, 2, 16, dtype=torch.bfloat16) * 20
    v = torch.randn(5, 2, 16, dtype=torch.bfloat16) * 20
    k_cache = torch.zeros(2, 16, 2, 16, dtype=fp8)
    v_cache = torch.zeros(2, 16, 2, 16, dtype=fp8)
    slots = torch.arange(16, 21)
    ops.store_kv(k, v, k_cache, v_cache, slots, k_scale=torch.tensor(0.5), v_scale=2.0)
    assert torch.equal(k_cache[1, :5], (k.float() / 0.5).to(fp8))
    assert torch.equal(v_cache[1, :5], (v.float() / 2.0).to(fp8))
    rel = ((k_cache[1, :5].float() * 0.5 - k.float()).norm() / k.float().norm()).item()
    assert rel < 0.1
