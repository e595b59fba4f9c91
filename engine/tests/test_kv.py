import numpy as np
import pytest
import torch
from lightspeed.kv import KVCache, KVLayout, KVPool, copy_pages, device_kv_budget, page_runs, resolve_kv_dtype


def _layout(dtype=torch.float32):
    return KVLayout(num_layers=3, num_kv_heads=2, head_dim=8, page_size=4, dtype=dtype)


def test_layout_bytes_and_dtypes():
    lay = _layout()
    assert lay.bytes_per_page == 2 * 3 * 4 * 2 * 8 * 4
    assert lay.pages_for(10 * lay.bytes_per_page + 5) == 10
    assert resolve_kv_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert resolve_kv_dtype("fp8", torch.bfloat16) is torch.float8_e4m3fn
    assert resolve_kv_dtype("fp16", torch.float32) is torch.float16
    with pytest.raises(ValueError):
        resolve_kv_dtype("int3", torch.float32)


def test_pool_views_share_one_buffer():
    pool = KVPool(_layout(), 6, "cpu")
    assert len(pool.kv_caches) == 3
    k1, v1 = pool.kv_caches[1]
    assert k1.shape == (6, 4, 2, 8) and k1.is_contiguous()
    k1[2].fill_(3.0)
    assert pool.buffer[2, 2].eq(3.0).all() and pool.buffer[3].eq(0).all()
    assert pool.k_scale is None
    with pytest.raises(ValueError):
        KVPool(_layout(), 1, "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_write_back_and_load_back_roundtrip(dtype):
    cache = KVCache(_layout(dtype), num_device_pages=8, num_host_pages=5, device="cpu")
    dev = cache.device_pool.buffer
    dev.copy_(torch.randn(dev.shape).to(dtype))
    before = dev.clone()
    copier = cache.copier
    copier.submit(4, np.array([[3, 1], [5, 4], [7, 2]]), np.empty((0, 2), np.int32), False)  # device -> host
    copier.submit(5, np.empty((0, 2), np.int32), np.array([[1, 6], [4, 2]]), False)            # host -> device
    assert copier.wait_all() == [4, 5] and copier.poll() == []
    host = cache.host_pool.buffer
    for d, h in ((3, 1), (5, 4), (7, 2)):
        assert torch.equal(host[:, h].float(), before[:, d].float())
    assert host[:, 0].float().eq(0).all()
    assert torch.equal(dev[:, 6].float(), before[:, 3].float())
    assert torch.equal(dev[:, 2].float(), before[:, 5].float())
    assert torch.equal(dev[:, 1].float(), before[:, 1].float())  # untouched
    if dtype == torch.float8_e4m3fn:
        assert cache.device_pool.is_fp8 and float(cache.device_pool.k_scale) == 1.0


def test_copies_complete_in_order_and_forward_waits():
    cache = KVCache(_layout(), num_device_pages=8, num_host_pages=8, device="cpu")
    cache.device_pool.buffer.normal_()
    pairs = np.array([[1, 1], [2, 2], [3, 3]])
    none = np.empty((0, 2), np.int32)
    cache.copier.submit(10, pairs, none, forward_waits=True)  # returns only once copied
    assert torch.equal(cache.host_pool.buffer[:, 1:4], cache.device_pool.buffer[:, 1:4])
    cache.copier.submit(11, none, pairs, False)
    done = []
    while len(done) < 2:
        done += cache.copier.poll()
    assert done == [10, 11] and cache.copier.num_in_flight == 0


def test_host_tier_off_has_no_host_pool():
    cache = KVCache(_layout(), num_device_pages=8, num_host_pages=0, device="cpu")
    assert cache.host_pool is None
    cache.copier.submit(1, np.empty((0, 2), np.int32), np.empty((0, 2), np.int32), False)
    with pytest.raises(RuntimeError, match="no host KV tier"):
        cache.copier.submit(2, np.array([[1, 1]]), np.empty((0, 2), np.int32), False)


def test_page_runs_coalesce_consecutive_pages():
    src, dst, length = page_runs(np.array([[5, 9], [3, 1], [4, 2], [6, 10], [8, 3]]))
    assert src.tolist() == [3, 5, 8] and dst.tolist() == [1, 9, 3] and length.tolist() == [2, 2, 1]
    assert page_runs(np.empty((0, 2), np.int32))[2].shape == (0,)


def test_copy_pages_checks():
    a, b = KVPool(_layout(), 4, "cpu"), KVPool(_layout(torch.float16), 4, "cpu")
    with pytest.raises(ValueError, match="differ in layout"):
        copy_pages(a, b, torch.tensor([1]), torch.tensor([2]))
    c = KVPool(_layout(), 4, "cpu")
    with pytest.raises(ValueError, match="length"):
        copy_pages(a, c, torch.tensor([1, 2]), torch.tensor([2]))
    copy_pages(a, c, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64))


def test_cpu_budget():
    assert device_kv_budget(torch.device("cpu"), 0.9, None, 0) == 1 << 30
    assert device_kv_budget(torch.device("cpu"), 0.9, 12345, 0) == 12345
