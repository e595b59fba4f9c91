"""CPU attention candidates (native one-pass decode, torch-SDPA prefill) against the dense float64
reference of test_attention.py over the awkward cases, and the native build's failure modes."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import ops
from lightspeed_kernel.cpu import native

from .paged_helpers import build_batch
from .test_attention import _dense_reference, _run

needs_native = pytest.mark.skipif(not native.available(), reason="no C compiler: native kernels not registered")

DECODE_CASES = [
    ([], []),  # empty batch
    ([0], [1]),  # first token only: length 1
    ([15, 16, 31, 32], [1, 1, 1, 1]),  # seq_len at and across page boundaries
    ([50, 3, 64], [4, 16, 2]),  # speculative: several query tokens, causal among them
    ([200, 0, 70], [16, 16, 1]),  # longer than one key chunk (64), with 16 query tokens
]


@needs_native
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("cached,q_lens", DECODE_CASES)
@pytest.mark.parametrize("heads", [(6, 2), (9, 3), (8, 1), (4, 4)])
def test_native_decode(page_size, cached, q_lens, heads):
    with lk.override(**{"attention/decode": "native_decode"}):
        got, expected = _run(ops.attention_decode, cached, q_lens, page_size, torch.float32, heads=heads, seed=7)
    torch.testing.assert_close(got.double(), expected, rtol=2e-5, atol=2e-5)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_native_decode_soft_cap_scales_and_threads(threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with lk.override(**{"attention/decode": "native_decode"}):
            got, expected = _run(ops.attention_decode, [20, 33, 90], [3, 5, 1], 16, torch.float32, heads=(9, 3),
                                 soft_cap=5.0, seed=3)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(got.double(), expected, rtol=2e-5, atol=2e-5)


def _stored_batch(cached, q_lens, cache_dtype, heads=(6, 2), head_dim=32, seed=0):
    batch = build_batch(cached, q_lens, 16, heads[1], head_dim, torch.float32, seed=seed)
    k_cache = torch.zeros(batch["cache_shape"], dtype=cache_dtype)
    v_cache = torch.zeros(batch["cache_shape"], dtype=cache_dtype)
    for b, slots in enumerate(batch["seq_slots"]):
        ops.store_kv(batch["k_seq"][b], batch["v_seq"][b], k_cache, v_cache, slots)
    q = torch.randn(sum(q_lens), heads[0], head_dim, generator=torch.Generator().manual_seed(seed + 1))
    args = (q, k_cache, v_cache, batch["page_table"], batch["query_start_loc"], batch["seq_lens"])
    return batch, args


@needs_native
def test_native_decode_reads_bf16_caches_and_applies_scalar_scales():
    batch, args = _stored_batch([40, 7], [2, 1], torch.bfloat16)
    kw = dict(max_query_len=2, scale=0.2, k_scale=0.5, v_scale=torch.tensor([2.0]))
    with lk.override(**{"attention/decode": "reference"}):
        expected = ops.attention_decode(*args, **kw)
    with lk.override(**{"attention/decode": "native_decode"}):
        got = ops.attention_decode(*args, **kw)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@needs_native
def test_native_decode_writes_into_out_views():
    batch, args = _stored_batch([10, 30], [1, 3], torch.float32)
    wide = torch.zeros(4, 6, 64)
    out = wide[..., :32]  # a non-contiguous destination
    with lk.override(**{"attention/decode": "native_decode"}):
        assert ops.attention_decode(*args, max_query_len=3, scale=0.3, out=out) is out
        plain = ops.attention_decode(*args, max_query_len=3, scale=0.3)
    torch.testing.assert_close(out, plain)
    assert torch.count_nonzero(wide[..., 32:]) == 0


PREFILL_CASES = [
    ([], []),
    ([0], [1]),
    ([0, 15, 16], [17, 1, 16]),
    ([63, 0], [2, 64]),
    ([100, 7, 3], [40, 0, 5]),  # cached prefix (bottom-right causal mask); a request with no new token
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("cached,q_lens", PREFILL_CASES)
def test_sdpa_prefill(dtype, page_size, cached, q_lens):
    with lk.override(**{"attention/prefill": "sdpa_prefill"}):
        got, expected = _run(ops.attention_prefill, cached, q_lens, page_size, dtype, heads=(9, 3), seed=4)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


def test_sdpa_prefill_is_the_cpu_pick_and_leaves_soft_cap_to_the_reference():
    assert lk.select_kernel("attention", "prefill", "float32", platform=lk.CPU).name == "sdpa_prefill"
    capped = lk.select_kernel("attention", "prefill", "float32", platform=lk.CPU, features=("soft_cap",))
    assert capped.name == "reference"
    batch, args = _stored_batch([5], [4], torch.float32)
    expected = _dense_reference(args[0], batch, [4], 0.25, soft_cap=2.0)
    torch.testing.assert_close(ops.attention_prefill(*args, max_query_len=4, scale=0.25, soft_cap=2.0).double(),
                               expected, rtol=2e-5, atol=2e-5)


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    """native.library() rebuilt from scratch in tmp_path; the real one restored afterwards."""
    monkeypatch.setenv("LIGHTSPEED_KERNEL_CACHE_DIR", str(tmp_path))
    lk.refresh()
    native.library.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    lk.refresh()
    native.library.cache_clear()


def test_a_failing_compiler_is_a_clear_error(fresh_native, monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_KERNEL_CC", "false")
    lk.refresh()
    with pytest.raises(native.NativeBuildError, match="LIGHTSPEED_KERNEL_DISABLE_NATIVE"):
        native.library()
    assert not list(fresh_native.glob("*.so"))  # nothing half-built left behind


@needs_native
def test_build_is_cached_per_source_version(fresh_native):
    lib = native.library()
    built = list(fresh_native.glob("*.so"))
    assert len(built) == 1 and lib.ls_w4_linear is not None
    native.library.cache_clear()
    native.library()
    assert list(fresh_native.glob("*.so")) == built  # loaded, not rebuilt


# -- the small per-token ops ----------------------------------------------------------------------------

needs_elementwise = pytest.mark.skipif(not native.available(), reason="no C compiler: native kernels not registered")


def _both(family, mode, fn):
    """fn() under the native kernel and under the reference."""
    with lk.override(**{f"{family}/{mode}": f"native_{mode}"}):
        native_result = fn()
    with lk.override(**{f"{family}/{mode}": "reference"}):
        reference_result = fn()
    return native_result, reference_result


@needs_elementwise
@pytest.mark.parametrize("tokens", [0, 1, 7, 300])  # 300 x 64 crosses the OpenMP threshold
def test_native_norms_and_activation(tokens):
    gen = torch.Generator().manual_seed(tokens)
    x, w = torch.randn(tokens, 64, generator=gen), torch.randn(64, generator=gen)
    got, ref = _both("norm", "rms", lambda: ops.rms_norm(x, w, 1e-5))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    strided = torch.randn(tokens, 128, generator=gen)[:, :64]  # rows with a stride
    got, ref = _both("norm", "rms", lambda: ops.rms_norm(strided, w, 1e-5))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    residual = torch.randn(tokens, 64, generator=gen)
    (got, got_res), (ref, ref_res) = _both("norm", "fused_add_rms", lambda: ops.fused_add_rms_norm(
        x, residual.clone(), w, 1e-5))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_res, ref_res, rtol=0, atol=0)
    gate_up = torch.randn(tokens, 2 * 40, generator=gen) * 6  # I = 40: a vector part and a tail
    got, ref = _both("activation", "silu_and_mul", lambda: ops.silu_and_mul(gate_up))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


@needs_elementwise
@pytest.mark.parametrize("is_neox", [True, False])
def test_native_rope_on_fused_qkv_views(is_neox):
    cache = ops.rope_cos_sin_cache(16, 64, 10000.0)  # rot_dim 16 of head_dim 32: partial rotary
    positions = torch.tensor([0, 5, 63])
    qkv = torch.randn(3, (4 + 2 + 2) * 32)
    q = qkv[:, :128].view(3, 4, 32)  # views with the fused projection's token stride
    k = qkv[:, 128:192].view(3, 2, 32)
    (gq, gk), (rq, rk) = _both("rope", "rotary", lambda: ops.apply_rope(positions, q.clone(), k.clone(), cache,
                                                                         is_neox=is_neox))
    torch.testing.assert_close(gq, rq, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gk, rk, rtol=1e-6, atol=1e-6)
    before = qkv.clone()
    with lk.override(**{"rope/rotary": "native_rotary"}):
        ops.apply_rope(positions, q, k, cache, is_neox=is_neox)  # in place, v untouched
        torch.testing.assert_close(q, rq)
        assert torch.equal(qkv[:, 192:], before[:, 192:])
        with pytest.raises(IndexError, match="position"):
            ops.apply_rope(torch.tensor([0, 1, 64]), q, k, cache)


@needs_elementwise
def test_native_store_kv_skips_padding_and_checks_slots():
    kv = torch.randn(4, 2 * 3 * 8)
    k, v = kv[:, :24].view(4, 3, 8), kv[:, 24:].view(4, 3, 8)
    slots = torch.tensor([5, -1, 0, 17], dtype=torch.int64)
    caches = [torch.zeros(6, 4, 3, 8) for _ in range(4)]
    with lk.override(**{"kv_store/paged": "native_paged"}):
        ops.store_kv(k, v, caches[0], caches[1], slots)
    with lk.override(**{"kv_store/paged": "reference"}):
        ops.store_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    with lk.override(**{"kv_store/paged": "native_paged"}), pytest.raises(IndexError, match="slot"):
        ops.store_kv(k, v, caches[0], caches[1], torch.tensor([0, 1, 2, 24]))


# -- native graphs --------------------------------------------------------------------------------------


@needs_native
def test_graph_replays_the_recorded_calls_on_new_inputs():
    from lightspeed_kernel import QuantizedWeight
    from lightspeed_kernel.cpu.graph import record

    w = QuantizedWeight.quantize(torch.randn(64, 32), 4, 32)
    x = torch.randn(2, 32)
    with torch.inference_mode():
        with record() as graph:
            y = ops.silu_and_mul(ops.linear(x, w))  # the outputs are allocated inside the recording
        assert len(graph) == 2 and torch.equal(y, ops.silu_and_mul(ops.linear(x, w)))
        x.copy_(torch.randn(2, 32))  # new inputs, in place
        graph.replay()
        torch.testing.assert_close(y, ops.silu_and_mul(ops.linear(x, w)))


@needs_native
def test_recording_rejects_torch_compute():
    from lightspeed_kernel.cpu.graph import GraphCaptureError, record

    x, w = torch.randn(4, 8), torch.ones(8)
    with torch.inference_mode(), pytest.raises(GraphCaptureError, match="add"):
        with record():
            ops.rms_norm(x, w, 1e-6)
            _ = x + 1  # a torch op: a replay would not redo it
    with torch.inference_mode(), pytest.raises(GraphCaptureError, match="ones"):
        with record():
            ops.rms_norm(x, torch.ones(8), 1e-6)  # filling a new tensor is compute too
    with torch.inference_mode(), record() as graph:  # views and no-op conversions are fine
        ops.rms_norm(x.view(2, 16)[:, :8].to(torch.float32), w, 1e-6)
    assert len(graph) == 1
