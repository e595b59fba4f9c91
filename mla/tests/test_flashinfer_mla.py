"""FlashInfer's MLA decode behind our contract: the page table -> CSR conversion against a plain Python
construction; registration with the library absent (nothing registers) and present (the stand-in of
flashinfer_standin.py, whose wrapper computes with our reference, so the adapter's output must equal the
reference); the real library against the reference on a GPU (pytest -m gpu, skipped elsewhere)."""

import importlib.util
import sys
import types

import lightspeed_kernel as lk
import pytest
import torch
from flashinfer_standin import BatchMLAPagedAttentionWrapper as StandIn
from flashinfer_standin import install
from lightspeed_mla import flashinfer_mla as fim
from lightspeed_mla import mla_decode_reference, registration
from mla_helpers import make_paged_cache, query_start, rel_err

HOPPER = lk.Platform.parse("sm_90")
SCALE = 192 ** -0.5


# --------------------------------------------------------------------------------------------------
# page table -> FlashInfer's CSR


def _python_csr(page_table, lens, page_size):
    indptr, indices = [0], []
    for row, n in zip(page_table.tolist(), lens, strict=True):
        pages = -(-n // page_size)
        indices += row[:pages]
        indptr.append(indptr[-1] + pages)
    return indptr, indices


LEN_CASES = [
    [1],  # a single token
    ["page"],  # a single full page
    ["page+1", 1, "3page-1"],  # partial last pages
    ["page", 0, "page"],  # a request with nothing cached (and no queries)
    [17, "2page", "page-1", 700],
]


@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("lens", LEN_CASES, ids=str)
def test_csr_matches_a_python_construction(page_size, lens):
    words = {"page": page_size, "page+1": page_size + 1, "page-1": page_size - 1, "2page": 2 * page_size,
             "3page-1": 3 * page_size - 1}
    lens = [words.get(n, n) for n in lens]
    q_lens = [min(n, 1 + i * 5 % 16) for i, n in enumerate(lens)]  # 1..16 query tokens, none where no keys
    width = max(-(-n // page_size) for n in lens) + 2
    gen = torch.Generator().manual_seed(page_size + len(lens))
    # stale page ids past each request's pages: the conversion must not copy them
    page_table = torch.randint(1, 1000, (len(lens), width), generator=gen, dtype=torch.int32)
    csr = fim.csr_metadata(page_table, torch.tensor(lens), query_start(q_lens), page_size)
    indptr, indices = _python_csr(page_table, lens, page_size)
    assert [t.dtype for t in csr] == [torch.int32] * 4 and all(t.device.type == "cpu" for t in csr)
    assert csr.qo_indptr.tolist() == query_start(q_lens).tolist() and csr.kv_len.tolist() == lens
    assert csr.kv_indptr.tolist() == indptr and csr.kv_indices.numel() == page_table.numel()
    assert csr.kv_indices[: indptr[-1]].tolist() == indices and not csr.kv_indices[indptr[-1]:].any()


def test_kv_indices_reads_a_strided_table_and_cuts_at_its_width():
    wide = torch.arange(40, dtype=torch.int32).view(4, 10)
    table = wide[1:3, 2:5]  # rows 1-2, columns 2-4 of a wider table: strides (10, 1)
    got = fim.kv_indices(table, torch.tensor([33, 40]), 16)
    assert got.tolist() == [12, 13, 14, 22, 23, 24]  # 3 pages each (the second cut from 3 to the width 3)
    assert fim.kv_indices(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0), 16).numel() == 0


def test_host_lengths_rejects_what_planning_would():
    with pytest.raises(ValueError, match="more pages"):
        fim.host_lengths([0, 1], [65], 16, 4)
    with pytest.raises(ValueError, match="more query tokens"):
        fim.host_lengths([0, 5], [4], 16, 4)
    with pytest.raises(ValueError, match=r"\[B\+1\]"):
        fim.host_lengths([1, 2], [4], 16, 4)


# --------------------------------------------------------------------------------------------------
# registration


def _registry():
    reg = lk.KernelRegistry(load_plugins=None)
    registration.register(reg)
    return reg


def _priority(reg, name):
    return {s.name: s for s in reg.specs("mla", "decode")}[name].priority


def test_absent_library_registers_nothing(monkeypatch):
    if importlib.util.find_spec("flashinfer") is None:  # this machine: the plugin registered without it
        assert fim.KERNEL_NAME not in {s.name for s in lk.list_kernels("mla")}
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # what an uninstalled package looks like
    reg = _registry()
    names = {s.name for s in reg.specs("mla")}
    assert fim.KERNEL_NAME not in names and {"mla_decode_triton", "mla_decode_reference"} <= names
    assert fim.discover(reg, page_sizes=(64,)) == (False, fim.NOT_INSTALLED)
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))  # a stub without a spec
    available, why = fim.discover(reg, page_sizes=(64,))
    assert not available and "ValueError" in why and fim.KERNEL_NAME not in {s.name for s in reg.specs("mla")}


def test_registers_above_triton_on_sm90_for_bf16_caches_only(monkeypatch):
    install(monkeypatch)
    reg = _registry()
    assert _priority(reg, fim.KERNEL_NAME) == lk.Priority.of(lk.Priority.PLUGIN, 2) > _priority(reg, "mla_decode_triton")
    bf16 = {"page_size": 64, "kv_dtype": "bf16"}
    chosen = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, traits=bf16)
    assert chosen.name == fim.KERNEL_NAME
    assert all(callable(getattr(chosen.impl, n)) for n in ("plan", "bind", "run"))  # the engine's graph path
    # FP8 caches (the engine asks with features paged + fp8_kv) are not FlashInfer's, not even when forced
    # (on this CPU machine mla_decode_sm90 is not registered: Triton is next).
    fp8 = dict(features=["paged", "fp8_kv"], traits={"page_size": 64, "kv_dtype": "fp8"})
    assert reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, **fp8).name == "mla_decode_triton"
    with pytest.raises(lk.KernelSelectionError):
        reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=fim.KERNEL_NAME, **fp8)
    for other in ("sm_80", "sm_100"):  # unmeasured there: not a candidate
        assert reg.select("mla", "decode", torch.bfloat16, platform=lk.Platform.parse(other),
                          traits=bf16).name != fim.KERNEL_NAME
    registration.register(reg)  # idempotent
    assert sum(s.name == fim.KERNEL_NAME for s in reg.specs("mla")) == 1


def test_library_loads_at_the_first_call_and_a_broken_one_raises(monkeypatch):
    install(monkeypatch)
    calls = []

    def broken_load():
        calls.append("load")
        raise OSError("bad .so")

    reg = lk.KernelRegistry(load_plugins=None)
    fim.register(reg, page_sizes=(16,), load=broken_load)
    assert calls == []  # registering imports nothing
    impl = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=fim.KERNEL_NAME).impl
    cache, table = make_paged_cache("bf16", 16, [5])
    with pytest.raises(ImportError, match="mla_decode_flashinfer.*OSError: bad .so"):
        impl(torch.zeros(1, 16, 576, dtype=torch.bfloat16), cache, table, torch.tensor([5]), torch.tensor([0, 1]), 0.1)
    assert calls == ["load"]
    monkeypatch.setitem(sys.modules, "flashinfer.mla", types.ModuleType("flashinfer.mla"))
    with pytest.raises(ImportError, match="lacks flashinfer.mla.BatchMLAPagedAttentionWrapper"):
        fim.load_library()


# --------------------------------------------------------------------------------------------------
# the adapter over the stand-in: equal to the reference


def _case(kind, page_size, lens, q_lens, heads, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    cache, table = make_paged_cache(kind, page_size, lens, device=device, generator=g)
    qsl = query_start(q_lens)
    q = torch.randn(int(qsl[-1]), heads, 576, generator=g).to(device, torch.bfloat16)
    return cache, table, torch.tensor(lens, dtype=torch.int32, device=device), qsl.to(device), q


@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("lens,q_lens", [([1], [1]), ([64], [16]), ([40, 129, 7, 300], [1, 4, 7, 16]),
                                         ([33, 0, 65], [2, 0, 1])])
@pytest.mark.parametrize("heads", [16, 128])
def test_adapter_over_the_stand_in_equals_the_reference(monkeypatch, page_size, lens, q_lens, heads):
    runner = fim.FlashInferMLA(install(monkeypatch))
    cache, table, seq_lens, qsl, q = _case("bf16", page_size, lens, q_lens, heads, seed=page_size + heads)
    out, lse = runner.decode(q, cache, table, seq_lens, qsl, SCALE, return_lse=True)
    ref, ref_lse = mla_decode_reference(q, cache, table, seq_lens, qsl, SCALE)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    assert StandIn.log == [("plan", "fa2"), ("run", "fa2")]  # CPU: fa2 (fa3 is picked on sm_90)


def test_one_plan_per_step_then_a_new_plan_for_new_metadata(monkeypatch):
    runner = fim.FlashInferMLA(install(monkeypatch))
    cache, table, seq_lens, qsl, q = _case("bf16", 64, [100, 300], [4, 4], 16)
    outs = [runner.decode(q, cache, table[:2], seq_lens[:2], qsl, SCALE) for _ in range(3)]  # three "layers"
    assert runner.plans == 1 and all(torch.equal(o, outs[0]) for o in outs)
    seq_lens[1] -= 64  # the next step: the same tensors rewritten in place
    got = runner.decode(q, cache, table, seq_lens, qsl, SCALE)
    assert runner.plans == 2 and torch.equal(got, mla_decode_reference(q, cache, table, seq_lens, qsl, SCALE)[0])


@pytest.mark.parametrize("change", ["fp8", "fp32", "24_heads", "misaligned"])
def test_what_flashinfer_cannot_take_goes_to_the_next_kernel(monkeypatch, change):
    install(monkeypatch)
    reg = _registry()
    impl = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=fim.KERNEL_NAME).impl
    heads = 24 if change == "24_heads" else 16
    cache, table, seq_lens, qsl, q = _case("fp8" if change == "fp8" else "bf16", 16, [50, 9], [3, 1], heads)
    if change == "fp32":
        q = q.float()
    if change == "misaligned":
        q = torch.empty(q.shape[0], heads, 577, dtype=q.dtype)[..., 1:].copy_(q)
    out = impl(q, cache, table, seq_lens, qsl, SCALE)
    assert StandIn.log == [] and fim.unsupported_reason(q, cache, table) is not None
    assert torch.equal(out, mla_decode_reference(q, cache, table, seq_lens, qsl, SCALE)[0])


def test_a_call_under_graph_capture_raises(monkeypatch):
    runner = fim.FlashInferMLA(install(monkeypatch))
    cache, table, seq_lens, qsl, q = _case("bf16", 16, [20], [2], 16)
    monkeypatch.setattr(fim, "_capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="enforce_eager"):
        runner.decode(q, cache, table, seq_lens, qsl, SCALE)


def test_planner_refusals_are_handed_on(monkeypatch):
    runner = fim.FlashInferMLA(install(monkeypatch))
    cache, table, seq_lens, qsl, q = _case("bf16", 16, [20, 20, 20], [1, 0, 0], 128)  # one 64-row tile, 128 heads
    assert runner.decode(q, cache, table, seq_lens, qsl, SCALE) is None and StandIn.log == []
    monkeypatch.setattr(fim, "MAX_WORK_ITEMS", 3)
    cache, table, seq_lens, qsl, q = _case("bf16", 16, [20, 20], [16, 16], 16)  # two 128-row tiles a request
    with pytest.raises(fim.FlashInferUnsupported, match="work items"):
        runner.plan(qsl, seq_lens, table, 16, page_size=16, softmax_scale=SCALE)


def test_fp8_format_copy_and_its_planned_run(monkeypatch):
    runner = fim.FlashInferMLA(install(monkeypatch))
    cache, table, seq_lens, qsl, q = _case("fp8", 32, [70, 33], [2, 5], 16, seed=3)
    copy = fim.fp8_format_copy(cache)
    assert copy.ckv is cache.latent and copy.kpe.dtype == torch.float8_e4m3fn
    assert copy.ckv_scale.shape == (*cache.latent.shape[:2], 4) and copy.ckv_scale.is_contiguous()
    ours, theirs = cache.dequantized(), copy.dequantized()
    assert torch.equal(theirs.latent, ours[0])  # the latent is shared exactly; the rope is requantised
    live = ours[1].abs() < 1e3  # tokens of the requests (the helper's poison page holds 1e4)
    assert rel_err(theirs.rope[live], ours[1][live]) < 0.1
    plan = runner.plan(qsl, seq_lens, table, 16, page_size=32, softmax_scale=SCALE, kv_dtype=torch.float8_e4m3fn,
                       with_lse=True)
    out, lse = torch.empty(q.shape[0], 16, 512, dtype=q.dtype), torch.empty(q.shape[0], 16)
    runner.run(plan, q, copy, out, lse)
    ref, ref_lse = mla_decode_reference(q, theirs, table, seq_lens, qsl, SCALE)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    with pytest.raises(ValueError, match="differ from the plan"):
        runner.run(plan, q, copy, out)  # planned with an LSE


# --------------------------------------------------------------------------------------------------
# the real library on a GPU (the grid of test_gpu.py)


def _real(**options):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return fim.FlashInferMLA(pytest.importorskip("flashinfer.mla"), **options)


def _check_real(runner, page_size, lens, q_lens, heads, seed):
    cache, table, seq_lens, qsl, q = _case("bf16", page_size, lens, q_lens, heads, seed=seed, device="cuda")
    out, lse = runner.decode(q, cache, table, seq_lens, qsl, SCALE, return_lse=True)
    ref, ref_lse = mla_decode_reference(q, cache, table, seq_lens, qsl, SCALE)
    assert rel_err(out, ref) < 1.5e-2, (page_size, lens, q_lens, heads)
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("q_len", [1, 2, 4, 16])
def test_real_pages_and_spec_tokens(page_size, q_len):
    lens = [q_len, page_size, page_size + 1, 3 * page_size - 1, 1000 + q_len]
    _check_real(_real(), page_size, lens, [q_len] * len(lens), 16, seed=q_len)


@pytest.mark.gpu
@pytest.mark.parametrize("heads,q_len", [(8, 16), (16, 4), (32, 2), (64, 1), (128, 1), (128, 8)])
@pytest.mark.parametrize("backend", ["fa3", "fa2"])
def test_real_heads(heads, q_len, backend):
    _check_real(_real(backend=backend), 64, [700, 2049], [q_len] * 2, heads, seed=heads)


@pytest.mark.gpu
def test_real_long_and_ragged_lengths():
    runner = _real()
    _check_real(runner, 64, [1, 64, 65, 81920], [1] * 4, 16, seed=4)
    _check_real(runner, 64, [4, 63, 4097, 81920], [4] * 4, 16, seed=5)
    _check_real(runner, 64, [81920, 30000], [16, 16], 128, seed=7)
    _check_real(runner, 64, [300, 5000, 17], [1, 16, 7], 16, seed=8)


@pytest.mark.gpu
def test_real_fp8_format_copy():
    runner = _real()
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("FlashInfer's FP8 MLA needs sm_90")
    cache, table, seq_lens, qsl, q = _case("fp8", 64, [700, 4097, 81920], [4] * 3, 16, seed=9, device="cuda")
    copy = fim.fp8_format_copy(cache)
    plan = runner.plan(qsl.cpu(), seq_lens.cpu(), table, 16, page_size=64, softmax_scale=SCALE,
                       kv_dtype=torch.float8_e4m3fn)
    out = torch.empty(q.shape[0], 16, 512, dtype=q.dtype, device="cuda")
    runner.run(plan, q, copy, out)
    assert rel_err(out, mla_decode_reference(q, copy.dequantized(), table, seq_lens, qsl, SCALE)[0]) < 1.5e-2


@pytest.mark.gpu
def test_real_planned_run_under_a_cuda_graph_and_the_registered_kernel():
    runner = _real()
    cache, table, seq_lens, qsl, q = _case("bf16", 64, [3000, 9000, 40, 20000], [4] * 4, 16, seed=10, device="cuda")
    plan = runner.plan(qsl.cpu(), seq_lens.cpu(), table, 16, page_size=64, softmax_scale=SCALE)
    out = torch.zeros(q.shape[0], 16, 512, dtype=q.dtype, device="cuda")
    runner.run(plan, q, cache, out)  # JIT-compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        runner.run(plan, q, cache, out)
    out.zero_()
    graph.replay()
    ref = mla_decode_reference(q, cache, table, seq_lens, qsl, SCALE)[0]
    assert rel_err(out, ref) < 1.5e-2
    reg = _registry()
    impl = reg.select("mla", "decode", torch.bfloat16, override=fim.KERNEL_NAME).impl
    assert rel_err(impl(q, cache, table, seq_lens, qsl, SCALE), ref) < 1.5e-2
