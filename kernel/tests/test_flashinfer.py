"""FlashInfer backend: page-table conversion against a plain Python construction; registration with
the library absent (nothing registers) and present (a stand-in `flashinfer` module whose wrappers
compute with our reference, to test the plumbing: planning, caching, fallbacks); the real kernels
against the reference on a GPU with flashinfer installed (skipped elsewhere)."""

import importlib.machinery
import importlib.util
import sys
import types

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import Priority, ops
from lightspeed_kernel import flashinfer as fi
from lightspeed_kernel.reference import attention as ref

from .paged_helpers import build_batch
from .test_contract import assert_honours_op_signature

HOPPER = lk.Platform.parse("sm_90")
AMPERE = lk.Platform.parse("sm_80")


# --------------------------------------------------------------------------------------------------
# page table -> FlashInfer's CSR metadata


def _python_metadata(page_table, seq_lens, page_size):
    indptr, indices, last = [0], [], []
    for row, seq_len in zip(page_table.tolist(), seq_lens.tolist(), strict=True):
        pages = min(-(-seq_len // page_size), len(row))
        indices += row[:pages]
        indptr.append(indptr[-1] + pages)
        last.append(0 if pages == 0 else min(seq_len - (pages - 1) * page_size, page_size))
    return indptr, indices, last


METADATA_CASES = [
    [],  # empty batch
    [0],  # one empty row
    [1],  # a single token
    ["page"],  # exactly one full page
    ["page", 0, 1, "page+1", "3page-1"],  # boundaries, an empty row in between
    [0, 0, 5],
]


@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("lens", METADATA_CASES, ids=str)
def test_metadata_matches_a_python_construction(page_size, lens):
    words = {"page": page_size, "page+1": page_size + 1, "3page-1": 3 * page_size - 1}
    seq_lens = torch.tensor([words.get(n, n) for n in lens], dtype=torch.int32)
    width = max([-(-int(s) // page_size) for s in seq_lens] + [1]) + 2
    gen = torch.Generator().manual_seed(page_size + len(lens))
    # stale page ids past each request's pages: the conversion must ignore them
    page_table = torch.randint(1, 1000, (len(lens), width), generator=gen, dtype=torch.int32)
    got = fi.paged_kv_metadata(page_table, seq_lens, page_size)
    indptr, indices, last = _python_metadata(page_table, seq_lens, page_size)
    assert got.indptr.dtype == got.indices.dtype == got.last_page_len.dtype == torch.int32
    assert got.indptr.tolist() == indptr and got.last_page_len.tolist() == last
    assert got.indices.numel() == page_table.numel()
    assert got.indices[: indptr[-1]].tolist() == indices and not got.indices[indptr[-1] :].any()


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("lens", METADATA_CASES, ids=str)
def test_host_lengths_give_the_device_csr(page_size, lens):
    words = {"page": page_size, "page+1": page_size + 1, "3page-1": 3 * page_size - 1}
    seq_lens = torch.tensor([words.get(n, n) for n in lens], dtype=torch.int32)
    width = max([-(-int(s) // page_size) for s in seq_lens] + [1])
    qsl = torch.arange(len(lens) + 1, dtype=torch.int32) * 3
    page_table = torch.ones(len(lens), width, dtype=torch.int32)
    device = fi.paged_kv_metadata(page_table, seq_lens, page_size)
    host = fi.host_paged_kv_lengths(ops.HostLengths(qsl.numpy(), seq_lens.numpy()), page_size, width)
    want = (qsl, device.indptr, device.last_page_len, seq_lens)
    for got, expected in zip(host, want, strict=True):
        assert got.dtype == torch.int32 and got.device.type == "cpu" and torch.equal(got, expected)
    short = fi.host_paged_kv_lengths(ops.HostLengths(qsl.numpy(), seq_lens.numpy() + 5 * page_size), page_size,
                                     width)  # rows claiming more pages than the table holds are cut, as on the device
    assert torch.equal(short[1], fi.paged_kv_metadata(page_table, seq_lens + 5 * page_size, page_size).indptr)


def test_metadata_cuts_a_row_past_its_table():
    page_table = torch.tensor([[3, 4], [5, 6]], dtype=torch.int32)
    got = fi.paged_kv_metadata(page_table, torch.tensor([100, 17], dtype=torch.int32), 16)
    assert got.indptr.tolist() == [0, 2, 4] and got.indices.tolist() == [3, 4, 5, 6]
    assert got.last_page_len.tolist() == [16, 1]


# --------------------------------------------------------------------------------------------------
# registration


def test_absent_library_registers_nothing(registry_sandbox, monkeypatch):
    if importlib.util.find_spec("flashinfer") is None:  # this machine: nothing registered at import
        assert not fi.AVAILABLE and "not installed" in fi.IMPORT_ERROR
        assert not {fi.DECODE_KERNEL, fi.PREFILL_KERNEL} & {s.name for s in lk.list_kernels("attention")}
    before = {s.name for s in lk.list_kernels("attention")}
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # what an uninstalled package looks like
    assert fi.discover(registry=registry_sandbox) == (False, fi.NOT_INSTALLED)
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))  # a stub, no spec
    available, why = fi.discover(registry=registry_sandbox)
    assert not available and "ValueError" in why
    assert {s.name for s in lk.list_kernels("attention")} == before


class _FakeWrapper:
    """FlashInfer's paged wrappers as far as the adapter drives them: plan() checks the CSR metadata
    and rebuilds our page table from it; run() computes with the reference, scales folded the way
    FlashInfer folds them (sm_scale * k_scale, output * v_scale)."""

    log: list

    def __init__(self, workspace, kv_layout="NHD", use_tensor_cores=False, backend="auto"):
        assert kv_layout == "NHD" and workspace.dtype == torch.uint8 and workspace.numel() == fi.WORKSPACE_BYTES
        self.use_tensor_cores, self.backend = use_tensor_cores, backend
        self.log.append(("init", type(self).kind, use_tensor_cores, backend))

    def _plan(self, qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
              *, causal, logits_soft_cap, sm_scale, q_data_type, kv_data_type, o_data_type, seq_lens,
              non_blocking):
        for t in (qo_indptr, indptr, last_page_len, seq_lens):
            assert t.device.type == "cpu" and t.dtype == torch.int32  # plan() reads them on the host
        assert isinstance(sm_scale, float) and isinstance(logits_soft_cap, float) and q_data_type == o_data_type
        counts = (indptr[1:] - indptr[:-1]).long()
        assert int(indptr[0]) == 0 and (counts >= 0).all() and indices.numel() >= int(indptr[-1])
        full = counts > 0
        assert ((last_page_len[full] >= 1) & (last_page_len[full] <= page_size)).all()
        assert torch.equal((counts - 1).clamp(min=0) * page_size + last_page_len, seq_lens.long())
        table = torch.zeros(len(counts), max(counts.tolist() + [1]), dtype=torch.int32)
        for b, (start, n) in enumerate(zip(indptr[:-1].tolist(), counts.tolist(), strict=True)):
            table[b, :n] = indices[start : start + n].cpu()
        self.planned = dict(qo_indptr=qo_indptr, table=table, seq_lens=seq_lens, causal=causal,
                            soft_cap=logits_soft_cap or None, scale=sm_scale, heads=(num_qo_heads, num_kv_heads))
        self.log.append(("plan", type(self).kind))

    def run(self, q, paged_kv_cache, *, k_scale=None, v_scale=None, out=None):
        k_cache, v_cache = paged_kv_cache
        p = self.planned
        assert out is not None and out.shape == q.shape and (q.shape[1], k_cache.shape[2]) == p["heads"]
        op = ref.attention_prefill if p["causal"] else ref.attention_decode
        dev = q.device
        got = op(q, k_cache, v_cache, p["table"].to(dev), p["qo_indptr"].to(dev), p["seq_lens"].to(dev),
                 max_query_len=int((p["qo_indptr"][1:] - p["qo_indptr"][:-1]).max()),
                 scale=p["scale"] * (k_scale or 1.0), soft_cap=p["soft_cap"])
        out.copy_(got.float() * (v_scale or 1.0))
        self.log.append(("run", type(self).kind))
        return out


class _FakeDecode(_FakeWrapper):
    kind = "decode"

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kw):
        qo_indptr = torch.arange(len(last_page_len) + 1, dtype=torch.int32)
        self._plan(qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                   causal=False, **kw)


class _FakePrefill(_FakeWrapper):
    kind = "prefill"

    def plan(self, qo_indptr, indptr, indices, last_page_len, *heads, causal=False, **kw):
        assert causal  # every call of ours is causal, bottom-right aligned
        self._plan(qo_indptr, indptr, indices, last_page_len, *heads, causal=True, **kw)


def _unregister(registry):
    """Drop the kernels `import lightspeed_kernel` registered where flashinfer is installed (the
    sandbox puts them back after the test)."""
    for mode, name in (("decode", fi.DECODE_KERNEL), ("prefill", fi.PREFILL_KERNEL)):
        if name in {s.name for s in registry.specs("attention", mode)}:
            registry.remove("attention", mode, name)


@pytest.fixture
def fake_flashinfer(registry_sandbox, monkeypatch):
    """A stand-in `flashinfer` in sys.modules, discovered and registered into the sandboxed registry."""
    log = []
    lib = types.ModuleType("flashinfer")
    lib.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    lib.__version__ = "0.7.2.post1"
    lib.BatchDecodeWithPagedKVCacheWrapper = type("Decode", (_FakeDecode,), {"log": log})
    lib.BatchPrefillWithPagedKVCacheWrapper = type("Prefill", (_FakePrefill,), {"log": log})
    monkeypatch.setitem(sys.modules, "flashinfer", lib)
    _unregister(registry_sandbox)
    assert fi.discover(registry=registry_sandbox) == (True, None)
    return log


def _forced(mode):
    name = fi.DECODE_KERNEL if mode == "decode" else fi.PREFILL_KERNEL
    return lk.select_kernel("attention", mode, torch.bfloat16, platform=HOPPER, override=name).impl


def _batch(cached, q_lens, page_size=16, heads=(8, 2), head_dim=64, dtype=torch.bfloat16, fp8=None, seed=0):
    """(args, kw, expected) of one op call: caches filled, q random, the reference's output."""
    batch = build_batch(cached, q_lens, page_size, heads[1], head_dim, dtype, seed=seed)
    k_cache = torch.zeros(batch["cache_shape"], dtype=fp8 or dtype)
    v_cache = torch.zeros_like(k_cache)
    scales = dict(k_scale=0.5, v_scale=0.25) if fp8 else {}
    for b, slots in enumerate(batch["seq_slots"]):
        ops.store_kv(batch["k_seq"][b], batch["v_seq"][b], k_cache, v_cache, slots, **scales)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(q_lens), heads[0], head_dim, generator=gen).to(dtype)
    args = (q, k_cache, v_cache, batch["page_table"], batch["query_start_loc"], batch["seq_lens"])
    kw = dict(max_query_len=max(q_lens, default=1), scale=head_dim**-0.5, **scales)
    return args, kw


def _expected(mode, args, kw):
    return (ref.attention_decode if mode == "decode" else ref.attention_prefill)(*args, **kw)


def test_bands_follow_the_h200_measurements(fake_flashinfer, monkeypatch):
    # decode: below Triton (ours measured faster at batch >= 16), reachable by override
    spec = next(s for s in lk.list_kernels("attention", "decode") if s.name == fi.DECODE_KERNEL)
    assert spec.priority == Priority.PORTABLE and spec.solution == "flashinfer"
    assert_honours_op_signature(spec)
    chosen = lk.select_kernel("attention", "decode", torch.bfloat16, platform=HOPPER, features=("fp8_kv",))
    if lk.TRITON_AVAILABLE:
        assert chosen.spec.solution == "triton" and chosen.spec.priority > spec.priority
    # prefill: FA3 measured faster served on the H200: above Triton on sm_90, no candidate elsewhere
    spec = next(s for s in lk.list_kernels("attention", "prefill") if s.name == fi.PREFILL_KERNEL)
    assert spec.priority == Priority.PERFORMANT + 1 and spec.solution == "flashinfer"
    assert_honours_op_signature(spec)
    assert lk.select_kernel("attention", "prefill", torch.bfloat16, platform=HOPPER).name == fi.PREFILL_KERNEL
    assert lk.select_kernel("attention", "prefill", torch.bfloat16, platform=AMPERE).name != fi.PREFILL_KERNEL
    for mode, name in (("decode", fi.DECODE_KERNEL), ("prefill", fi.PREFILL_KERNEL)):
        assert lk.select_kernel("attention", mode, torch.float32, platform=lk.CPU).name != name
        monkeypatch.setenv(f"LIGHTSPEED_KERNEL_OVERRIDE_ATTENTION_{mode.upper()}", name)
        lk.refresh()
        assert lk.select_kernel("attention", mode, torch.bfloat16, platform=HOPPER).name == name
    assert fake_flashinfer == []  # registration never touched the library


CASES = [  # (mode, cached lens, query lens, page size, heads)
    ("decode", [5, 16, 40], [1, 1, 1], 16, (8, 2)),  # group 4: CUDA-core decode
    ("decode", [0, 31, 64], [1, 1, 1], 32, (8, 1)),  # group 8: tensor-core decode
    ("decode", [50, 3, 64], [4, 1, 2], 64, (8, 2)),  # speculative rows: the prefill wrapper, causal
    ("prefill", [0, 17, 33], [20, 0, 15], 16, (8, 2)),  # a prefix, a row with no new token
    ("prefill", [63], [1], 64, (4, 4)),
]


@pytest.mark.parametrize("mode,cached,q_lens,page_size,heads", CASES)
def test_adapter_over_a_stand_in_equals_the_reference(fake_flashinfer, mode, cached, q_lens, page_size, heads):
    args, kw = _batch(cached, q_lens, page_size, heads)
    out = torch.full_like(args[0], float("nan"))
    got = _forced(mode)(*args, out=out, **kw)
    assert got is out
    torch.testing.assert_close(got, _expected(mode, args, kw), rtol=2e-2, atol=2e-2)
    wrapper = "decode" if mode == "decode" and max(q_lens) == 1 else "prefill"
    assert ("run", wrapper) in fake_flashinfer
    if wrapper == "decode":
        assert ("init", "decode", heads[0] // heads[1] > 4, "auto") in fake_flashinfer


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_soft_cap_and_fp8_scales_reach_the_library(fake_flashinfer, mode):
    args, kw = _batch([30, 0], [1, 1] if mode == "decode" else [2, 9], fp8=torch.float8_e4m3fn, seed=5)
    got = _forced(mode)(*args, soft_cap=5.0, **kw)
    torch.testing.assert_close(got, _expected(mode, args, dict(kw, soft_cap=5.0)), rtol=2e-2, atol=2e-2)
    assert ("run", "decode" if mode == "decode" else "prefill") in fake_flashinfer


def test_one_plan_per_step_then_a_new_plan_for_new_metadata(fake_flashinfer):
    args, kw = _batch([40, 7], [1, 1])
    q, k_cache, v_cache, page_table, qsl, seq_lens = args
    decode = _forced("decode")
    for _layer in range(4):  # every layer slices the step's tensors afresh, as the engine does
        decode(q, k_cache, v_cache, page_table[:2], qsl[:3], seq_lens[:2], **kw)
    assert [e for e in fake_flashinfer if e[0] == "plan"] == [("plan", "decode")]
    assert sum(e[0] == "run" for e in fake_flashinfer) == 4
    seq_lens[0] -= 1  # the next step rewrites its metadata in place: torch bumps the version
    want = ref.attention_decode(*args, **kw)
    torch.testing.assert_close(decode(*args, **kw), want)
    assert sum(e[0] == "plan" for e in fake_flashinfer) == 2
    decode(*args, **dict(kw, scale=0.5))  # another configuration: its own wrapper and plan
    assert sum(e[0] == "init" for e in fake_flashinfer) == 2


def test_metadata_made_under_inference_mode_plans_once_per_step(fake_flashinfer):
    # the engine builds each step's metadata under inference_mode: no version counter to read
    prefill = _forced("prefill")
    for step in range(2):
        with torch.inference_mode():
            args, kw = _batch([40 + step, 3], [9, 5], seed=step)
            for _layer in range(3):
                got = prefill(*args, **kw)
        torch.testing.assert_close(got, ref.attention_prefill(*args, **kw))
    assert sum(e[0] == "plan" for e in fake_flashinfer) == 2


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_host_lengths_plan_without_a_read_back(fake_flashinfer, mode, monkeypatch):
    args, kw = _batch([40, 7, 0], [1, 1, 1] if mode == "decode" else [5, 0, 12])
    host = ops.HostLengths(args[4].numpy().copy(), args[5].numpy().copy())
    paged = fi.FlashInferPaged(sys.modules["flashinfer"])
    for _layer in range(3):
        got = getattr(paged, mode)(*args, **kw, host_lengths=host)
    torch.testing.assert_close(got, _expected(mode, args, kw), rtol=2e-2, atol=2e-2)
    assert paged.plans == 1 and paged.host_reads == 0
    getattr(paged, mode)(*args, **dict(kw, scale=0.3))  # no host lengths: the one read-back of a plan
    assert paged.plans == 2 and paged.host_reads == 1
    # the registered op hands them to the adapter
    seen = []
    plan = fi.FlashInferPaged._plan
    monkeypatch.setattr(fi.FlashInferPaged, "_plan", lambda self, *a: seen.append(a[-1]) or plan(self, *a))
    _forced(mode)(*args, **kw, host_lengths=host)
    assert seen == [host]


def test_prepared_call_only_runs(fake_flashinfer):
    args, kw = _batch([70, 2], [3, 1], page_size=32)
    paged = fi.FlashInferPaged(sys.modules["flashinfer"])
    out = torch.empty_like(args[0])
    launch = paged.prepare("decode", *args, out=out, **kw)
    assert paged.plans == 1 and [e[0] for e in fake_flashinfer] == ["init", "plan"]
    for _replay in range(3):
        assert launch() is out
    assert paged.plans == 1 and [e[0] for e in fake_flashinfer].count("run") == 3
    torch.testing.assert_close(out, _expected("decode", args, kw), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("change", ["head_dim_32", "fp32", "tensor_scale", "capture"])
def test_what_flashinfer_does_not_take_goes_to_the_next_kernel(fake_flashinfer, monkeypatch, change):
    dtype = torch.float32 if change == "fp32" else torch.bfloat16
    head_dim = 32 if change == "head_dim_32" else 64
    fp8 = torch.float8_e4m3fn if change == "tensor_scale" else None
    args, kw = _batch([20, 3], [1, 1], head_dim=head_dim, dtype=dtype, fp8=fp8, seed=7)
    if change == "tensor_scale":
        kw = dict(kw, k_scale=torch.tensor([kw["k_scale"]]), v_scale=torch.tensor(kw["v_scale"]))
    if change == "capture":
        monkeypatch.setattr(fi, "_capturing", lambda device: True)
    for mode in ("decode", "prefill"):
        torch.testing.assert_close(_forced(mode)(*args, **kw), _expected(mode, args, kw))
    assert fake_flashinfer == []  # the library was loaded, never planned or run
    paged = fi.FlashInferPaged(sys.modules["flashinfer"])
    assert paged.decode(*args, **kw) is None and paged.prefill(*args, **kw) is None


def test_library_loads_at_the_first_call_and_a_broken_one_raises(registry_sandbox, monkeypatch):
    loads = []

    def broken():
        loads.append(1)
        raise RuntimeError("libcudart.so.13: cannot open shared object file")

    _unregister(registry_sandbox)
    fi.register(load=broken, registry=registry_sandbox)
    assert loads == []
    args, kw = _batch([4], [1])
    with pytest.raises(ImportError, match=f"{fi.DECODE_KERNEL}.*does not load.*libcudart"):
        _forced("decode")(*args, **kw)
    assert loads == [1]


def test_missing_wrappers_are_an_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    with pytest.raises(ImportError, match="lacks BatchDecodeWithPagedKVCacheWrapper"):
        fi.load_library()


# --------------------------------------------------------------------------------------------------
# the real library on a GPU (skipped without CUDA and flashinfer)


def _cuda(args, kw):
    return tuple(t.cuda() for t in args), kw


def _check(got, want):
    assert got is not None, "FlashInfer handed the call on"
    err = ((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30)).item()
    assert err < 1e-2, err


GPU_CASES = [  # (mode, cached, q lens, page size, heads, head dim, prefill backend)
    ("decode", [8191, 33, 2048, 100, 0] * 4, [1] * 20, 16, (32, 8), 128, "auto"),
    ("decode", [4000, 17, 1], [1, 1, 1], 64, (32, 4), 128, "auto"),  # tensor-core decode
    ("decode", [50, 3, 64, 999], [4, 1, 16, 2], 16, (32, 8), 128, "auto"),  # speculative rows
    ("prefill", [0, 1000, 4999, 17], [300, 64, 1, 129], 16, (32, 8), 128, "auto"),  # FA3 on sm_90
    ("prefill", [0, 1000, 4999, 17], [300, 64, 1, 129], 64, (32, 8), 128, "fa2"),
    ("prefill", [20000], [800], 16, (16, 2), 64, "auto"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("mode,cached,q_lens,page_size,heads,head_dim,backend", GPU_CASES)
def test_flashinfer_matches_the_reference_on_gpu(mode, cached, q_lens, page_size, heads, head_dim, backend):
    paged = fi.FlashInferPaged(pytest.importorskip("flashinfer"), prefill_backend=backend)
    args, kw = _cuda(*_batch(cached, q_lens, page_size, heads, head_dim, seed=3))
    run = paged.decode if mode == "decode" else paged.prefill
    _check(run(*args, **kw), _expected(mode, args, kw))
    assert paged.plans == 1
    _check(run(*args, **kw), _expected(mode, args, kw))  # a second layer: no new plan
    assert paged.plans == 1
    if mode == "prefill" and backend == "auto" and torch.cuda.get_device_capability() == (9, 0):
        (planned,) = paged._planned.values()
        assert planned.wrapper._backend == "fa3"  # FlashInfer's "auto" resolved to its sm_90 path


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_flashinfer_soft_cap_and_fp8_on_gpu(mode):
    paged = fi.FlashInferPaged(pytest.importorskip("flashinfer"))
    lens = [1, 1, 1] if mode == "decode" else [40, 1, 200]
    args, kw = _cuda(*_batch([300, 5, 0], lens, 16, (32, 8), 128, fp8=torch.float8_e4m3fn, seed=4))
    run = paged.decode if mode == "decode" else paged.prefill
    _check(run(*args, **kw), _expected(mode, args, kw))
    args, kw = _cuda(*_batch([300, 5, 0], lens, 16, (32, 8), 128, seed=4))
    _check(run(*args, soft_cap=30.0, **kw), _expected(mode, args, dict(kw, soft_cap=30.0)))


@pytest.mark.gpu
def test_flashinfer_through_the_public_ops_and_under_a_cuda_graph(monkeypatch):
    lib = pytest.importorskip("flashinfer")
    assert fi.AVAILABLE, fi.IMPORT_ERROR
    runs = []
    for cls in (lib.BatchDecodeWithPagedKVCacheWrapper, lib.BatchPrefillWithPagedKVCacheWrapper):
        def counted(self, *a, _run=cls.run, _name=cls.__name__, **k):
            runs.append(_name)
            return _run(self, *a, **k)
        monkeypatch.setattr(cls, "run", counted)
    args, kw = _cuda(*_batch([3000] * 8, [1] * 8, 16, (32, 8), 128, seed=6))
    out = torch.empty_like(args[0])
    ops.attention_decode(*args, out=out, **kw)  # Triton, compiled outside the capture
    with lk.override(**{"attention/decode": fi.DECODE_KERNEL, "attention/prefill": fi.PREFILL_KERNEL}):
        _check(ops.attention_decode(*args, **kw), _expected("decode", args, kw))
        _check(ops.attention_prefill(*args, **kw), _expected("prefill", args, kw))
        assert runs == ["BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"]
        graph = torch.cuda.CUDAGraph()  # under capture the call goes to Triton: one capture serves any seq_len
        with torch.cuda.graph(graph):
            ops.attention_decode(*args, out=out, **kw)
    assert len(runs) == 2
    args[5].sub_(1000)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, _expected("decode", args, kw))
