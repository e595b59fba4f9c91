import subprocess
import sys

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import (
    CPU,
    Capability,
    KernelSelectionError,
    Platform,
    Priority,
    register_kernel,
    select_kernel,
)
from lightspeed_kernel.registry.priority import band_of

H100 = Platform.parse("sm_90")
A100 = Platform.parse("sm_80")
B200 = Platform.parse("sm_100")
MI300 = Platform.parse("rocm:9.4")


def _impl(tag):
    def fn(*args, **kwargs):
        return tag

    return fn


def _reg(name, priority, family="t_reg", mode="m", **kw):
    kw.setdefault("solution", "test")
    register_kernel(family, mode, name=name, priority=priority, **kw)(_impl(name))


def test_priority_bands():
    assert [int(p) for p in Priority] == [0, 4, 8, 12, 16]
    assert Priority.of(Priority.PERFORMANT, 3) == 11
    assert band_of(19) is Priority.PLUGIN and band_of(7) is Priority.PORTABLE
    with pytest.raises(ValueError):
        Priority.of(Priority.PLUGIN, 4)
    with pytest.raises(ValueError):
        lk.KernelSpec("x", "f", "m", "s", priority=20)


def test_platform_parse_and_cpu():
    assert H100.compute_capability == (9, 0) and H100.is_cuda and not H100.is_rocm
    assert B200.compute_capability == (10, 0)
    assert Platform.parse("cuda:8.9").compute_capability == (8, 9)
    assert MI300.is_rocm and MI300.vendor == "amd"
    assert lk.platform_of(torch.device("cpu")) is CPU and CPU.is_cpu
    if not torch.cuda.is_available():
        assert lk.current_platform() is CPU
    with pytest.raises(ValueError):
        Platform.parse("tpu")


def test_import_does_not_initialise_cuda():
    code = "import torch, lightspeed_kernel; from lightspeed_kernel import ops; print(torch.cuda.is_initialized())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_capability_filter(registry_sandbox):
    _reg("ref", Priority.REFERENCE)
    _reg(
        "hopper",
        Priority.SPECIALIZED,
        capability={"vendors": "nvidia", "min_compute_capability": (9, 0), "max_compute_capability": (9, 0)},
    )
    _reg("gpu", Priority.PORTABLE, capability="cuda")
    _reg("amd", Priority.PERFORMANT, capability="rocm")
    assert select_kernel("t_reg", "m", "float32", platform=CPU).name == "ref"
    assert select_kernel("t_reg", "m", "float32", platform=H100).name == "hopper"
    assert select_kernel("t_reg", "m", "float32", platform=A100).name == "gpu"
    assert select_kernel("t_reg", "m", "float32", platform=B200).name == "gpu"
    assert select_kernel("t_reg", "m", "float32", platform=MI300).name == "amd"


def test_dtype_feature_trait_filters(registry_sandbox):
    _reg("ref", Priority.REFERENCE)
    _reg("bf16_only", Priority.PORTABLE, dtypes=["bfloat16"])
    _reg("fp8", Priority.PORTABLE + 1, dtypes=[torch.float16], features=["fp8_kv"])
    _reg(
        "paged64",
        Priority.PERFORMANT,
        dtypes=[torch.bfloat16],
        traits={"page_size": 64, "head_dim": (64, 128)},
    )
    assert select_kernel("t_reg", "m", torch.float32, platform=CPU).name == "ref"
    assert select_kernel("t_reg", "m", torch.bfloat16, platform=CPU).name == "paged64"
    assert select_kernel("t_reg", "m", "bf16", traits={"page_size": 16}, platform=CPU).name == "bf16_only"
    assert (
        select_kernel("t_reg", "m", "bf16", traits={"page_size": 64, "head_dim": 128}, platform=CPU).name
        == "paged64"
    )
    assert select_kernel("t_reg", "m", "bf16", traits={"head_dim": 96}, platform=CPU).name == "bf16_only"
    assert select_kernel("t_reg", "m", "float16", features=["fp8_kv"], platform=CPU).name == "fp8"
    with pytest.raises(KernelSelectionError, match="lacks features"):
        select_kernel("t_reg", "m", "bfloat16", features=["fp8_kv"], platform=CPU)


def test_ranking_objective_and_deterministic_ties(registry_sandbox):
    for name in ("zeta", "alpha", "mid"):
        _reg(name, Priority.PORTABLE, family="t_tie")
    _reg("low_latency", Priority.REFERENCE + 1, family="t_tie", tags=["latency"])
    assert select_kernel("t_tie", "m", None, platform=CPU).name == "alpha"
    assert select_kernel("t_tie", "m", None, platform=CPU, objective="latency").name == "low_latency"
    ranks = [c.name for c in lk.explain("t_tie", "m", platform=CPU).candidates]
    assert ranks == ["alpha", "mid", "zeta", "low_latency"]


def test_selection_is_cached_and_invalidated(registry_sandbox):
    _reg("a", Priority.PORTABLE, family="t_cache")
    first = select_kernel("t_cache", "m", "float32", platform=CPU)
    assert select_kernel("t_cache", "m", "float32", platform=CPU) is first
    assert first.impl() == "a" and first.spec.priority == Priority.PORTABLE
    _reg("b", Priority.PLUGIN, family="t_cache")  # registering drops the cached choice
    assert select_kernel("t_cache", "m", "float32", platform=CPU).name == "b"


def test_duplicate_and_missing(registry_sandbox):
    _reg("a", 0, family="t_dup")
    with pytest.raises(ValueError, match="already registered"):
        _reg("a", 1, family="t_dup")
    with pytest.raises(KernelSelectionError, match="no kernel is registered"):
        select_kernel("t_nothing", "m", "float32", platform=CPU)
    _reg("gpu_only", 4, family="t_gpu", capability="cuda")
    with pytest.raises(KernelSelectionError, match="needs device cuda"):
        select_kernel("t_gpu", "m", "float32", platform=CPU)


def test_explain_reports_ranks_and_rejections(registry_sandbox):
    _reg("ref", 0, family="t_exp")
    _reg("hopper", 12, family="t_exp", capability=Capability(("cuda",), ("nvidia",), (9, 0), (9, 0)))
    report = lk.explain("t_exp", "m", "bfloat16", platform=A100)
    by_name = {c.name: c for c in report.candidates}
    assert by_name["ref"].rank == 1 and by_name["ref"].reason is None
    assert by_name["hopper"].rank is None and "compute capability >= 9.0" in by_name["hopper"].reason
    assert report.selected == "ref"
    assert "rejected" in str(report) and "selected: ref" in str(report)


def test_ops_dispatch_through_registry(registry_sandbox):
    calls = []

    @register_kernel(
        "activation",
        "silu_and_mul",
        name="t_spy",
        solution="test",
        priority=Priority.PLUGIN,
        capability="cpu",
        dtypes=["float32"],
    )
    def spy(x, *, out=None):
        calls.append(x.dtype)
        return x[..., : x.shape[-1] // 2]

    x = torch.randn(2, 8)
    assert lk.ops.silu_and_mul(x).shape == (2, 4) and calls == [torch.float32]
    lk.ops.silu_and_mul(x.bfloat16())  # bf16 is not the spy's: the reference runs
    assert calls == [torch.float32]


def test_every_op_family_has_a_cpu_reference():
    families = {(s.family, s.mode) for s in lk.list_kernels() if s.solution == "reference"}
    expected = {
        ("norm", "rms"),
        ("norm", "fused_add_rms"),
        ("norm", "rms_linear"),
        ("activation", "silu_and_mul_linear"),
        ("rope", "rotary"),
        ("activation", "silu_and_mul"),
        ("activation", "gelu_and_mul"),
        ("kv_store", "paged"),
        ("attention", "prefill"),
        ("attention", "decode"),
        ("gemm", "bf16"),
        ("gemm", "fp8_block"),
        ("gemm", "w4"),
        ("gemm", "w8"),
        ("gemm", "w4_dequant"),
        ("gemm", "w8_dequant"),
        ("moe", "topk"),
        ("moe", "fused_experts"),
        ("quantize", "fp8_per_token"),
        ("quantize", "fp8_per_block"),
        ("quantize", "fp8_per_token_head"),
        ("sampling", "penalties"),
        ("sampling", "sample"),
        ("sampling", "logprobs"),
        ("sampling", "greedy"),
    }
    assert expected <= families
    # bf16 on the CPU: the references, except prefill (torch's fused attention), the quantised
    # GEMMs (native C kernels where a compiler exists; they take bf16 activations) and the norm +
    # projection (the composition of the two ops, each then picking its own)
    cpu_picks = {("attention", "prefill"): {"sdpa_prefill"}, ("gemm", "w4"): {"native_w4", "reference"},
                 ("gemm", "w8"): {"native_w8", "reference"}, ("norm", "rms_linear"): {"composed_rms_norm_linear"},
                 ("activation", "silu_and_mul_linear"): {"composed_silu_and_mul_linear"}}
    for family, mode in expected:
        picked = select_kernel(family, mode, "bfloat16", platform=CPU).name
        assert picked in cpu_picks.get((family, mode), {"reference"}), (family, mode, picked)


def test_public_api_exports():
    for name in lk.__all__:
        assert hasattr(lk, name), name
    for name in lk.ops.__all__:
        assert callable(getattr(lk.ops, name)), name
