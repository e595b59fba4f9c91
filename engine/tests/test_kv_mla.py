"""MLA KV pools: layouts and sizes, page tensors with the page axis at dim 1, per-layer MLACache
views, and write-back / load-back round trips through the copier between the device pool and its
host mirror."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightspeed.kv import (
    KVCache,
    KVLayout,
    MLAKVCache,
    MLAKVPool,
    MLALayout,
    build_kv_cache,
    copy_pages,
    kv_layout_for,
)
from lightspeed.models import preset_config

KINDS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def _fill(pool: MLAKVPool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in pool.page_tensors:
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))


def test_layouts_and_bytes():
    bf16, fp8 = MLALayout(3, 16, torch.bfloat16), MLALayout(3, 16, torch.float8_e4m3fn)
    assert bf16.kind == "bf16" and fp8.kind == "fp8"
    assert bf16.bytes_per_page == 3 * 16 * 576 * 2 and fp8.bytes_per_page == 3 * 16 * (512 + 4 + 128)
    assert bf16.pages_for(10 * bf16.bytes_per_page + 1) == 10
    for kind, dtype in KINDS.items():
        pool = MLAKVPool(MLALayout(3, 16, dtype), 5, "cpu")
        assert pool.nbytes == 5 * pool.bytes_per_page, kind  # nothing but the pages
        assert all(t.shape[:3] == (3, 5, 16) for t in pool.page_tensors)  # [L, pages, page_size, ...]
    mla = kv_layout_for(preset_config("tiny-deepseek-v3"), 16, torch.float32)
    mha = kv_layout_for(preset_config("tiny-llama"), 16, torch.float32)
    assert isinstance(mla, MLALayout) and mla.num_layers == 3 and isinstance(mha, KVLayout)
    assert isinstance(build_kv_cache(mla, 4, 2, "cpu"), MLAKVCache)
    assert isinstance(build_kv_cache(mha, 4, 2, "cpu"), KVCache)
    with pytest.raises(ValueError, match="at least 2 pages"):
        MLAKVPool(bf16, 1, "cpu")
    with pytest.raises(ValueError, match="page_size=512"):
        kv_layout_for(preset_config("tiny-deepseek-v3"), 512, torch.bfloat16)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_layer_views_share_the_page_tensors(kind):
    pool = MLAKVPool(MLALayout(2, 4, KINDS[kind]), 6, "cpu")
    cache = pool.kv_caches[1]
    assert cache.kind == ("fp8" if kind == "fp8" else "bf16") and cache.page_size == 4 and cache.num_pages == 6
    assert cache.latent.shape == (6, 4, 512) and cache.rope.shape == (6, 4, 64)
    cache.rope[3, 2].fill_(5.0)
    rope_tensor = pool.page_tensors[-1]
    assert (rope_tensor[1, 3, 2, -64:].float() == 5.0).all() and (rope_tensor[0].float() == 0).all()
    if kind == "fp8":
        assert cache.scale.shape == (6, 4, 1)
        cache.scale[2, 1] = 7.0
        assert pool.page_tensors[1][1, 2, 1] == 7.0
    assert pool.k_scale is None and pool.v_scale is None


def _copy(cache, write_back=(), load_back=()) -> None:
    """One plan's copies through the cache's copier (write-back first), waited for."""
    wb, lb = (np.asarray(p, dtype=np.int64).reshape(-1, 2) for p in (write_back, load_back))
    cache.copier.submit(1, wb, lb, forward_waits=False)
    assert cache.copier.wait_all() == [1]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_write_back_and_load_back_roundtrip(kind):
    cache = MLAKVCache(MLALayout(3, 4, KINDS[kind]), num_device_pages=8, num_host_pages=5, device="cpu")
    assert [t.shape[1] for t in cache.host_pool.page_tensors] == [5] * len(cache.device_pool.page_tensors)
    _fill(cache.device_pool, 0)
    before = [t.clone() for t in cache.device_pool.page_tensors]
    _copy(cache, write_back=[[3, 1], [5, 4], [7, 2]])  # device page -> host page
    for dev, host in zip(before, cache.host_pool.page_tensors, strict=True):
        for d, h in ((3, 1), (5, 4), (7, 2)):
            assert torch.equal(host[:, h].view(torch.uint8), dev[:, d].view(torch.uint8))  # bit-exact
        assert (host[:, 0].float() == 0).all()  # the host tier's padding page
    _copy(cache, load_back=[[1, 6], [4, 2]])  # host page -> device page
    for old, dev in zip(before, cache.device_pool.page_tensors, strict=True):
        assert torch.equal(dev[:, 6].view(torch.uint8), old[:, 3].view(torch.uint8))
        assert torch.equal(dev[:, 2].view(torch.uint8), old[:, 5].view(torch.uint8))
        assert torch.equal(dev[:, 1].view(torch.uint8), old[:, 1].view(torch.uint8))  # untouched
    # The per-layer views see the loaded-back pages: layer 2's latent of page 6 is page 3's from before.
    latent_6, _ = cache.kv_caches[2].dequantized()
    cache.device_pool.page_tensors[0][:, 3].copy_(before[0][:, 3])
    latent_3, _ = cache.kv_caches[2].dequantized()
    assert torch.equal(latent_6[6], latent_3[3])


def test_copy_checks_and_tier_off():
    a = MLAKVPool(MLALayout(2, 4, torch.bfloat16), 4, "cpu")
    b = MLAKVPool(MLALayout(2, 4, torch.float8_e4m3fn), 4, "cpu")
    with pytest.raises(ValueError, match="differ in layout"):
        copy_pages(a, b, torch.tensor([1]), torch.tensor([2]))
    c = MLAKVPool(MLALayout(2, 8, torch.bfloat16), 4, "cpu")
    with pytest.raises(ValueError, match="differ in layout"):
        copy_pages(a, c, torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="length"):
        copy_pages(a, a.host_mirror(3), torch.tensor([1, 2]), torch.tensor([2]))
    off = MLAKVCache(MLALayout(2, 4, torch.bfloat16), 4, 0, "cpu")
    assert off.host_pool is None
    with pytest.raises(RuntimeError, match="no host KV tier"):
        off.copier.submit(1, np.array([[1, 1]]), np.empty((0, 2), np.int64), forward_waits=False)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_gpu_pool_pinned_mirror_roundtrip(kind):
    cache = MLAKVCache(MLALayout(4, 64, KINDS[kind]), num_device_pages=16, num_host_pages=8, device="cuda")
    _fill(cache.device_pool, 1)
    before = [t.clone() for t in cache.device_pool.page_tensors]
    _copy(cache, write_back=[[9, 3], [10, 4]])
    _copy(cache, load_back=[[3, 12], [4, 13]])
    torch.cuda.synchronize()
    for old, dev in zip(before, cache.device_pool.page_tensors, strict=True):
        assert torch.equal(dev[:, 12:14].view(torch.uint8), old[:, 9:11].view(torch.uint8))
