"""The sm_90a CUDA decode kernel's host side on the CPU: registration gating, planning, input checks,
the JIT build command, and (where nvcc is installed) an sm_90a compile of the kernel with ptxas'
resource report. The kernel's numbers are tested on the GPU (test_sm90_gpu.py)."""

import re
import shutil
import subprocess

import pytest
import torch
from lightspeed_mla import MLACache, decode_workspace_bytes, plan_decode, registration, sm90

lk = pytest.importorskip("lightspeed_kernel")
HOPPER, AMPERE, BLACKWELL = (lk.Platform.parse(p) for p in ("sm_90", "sm_80", "sm_100"))
SCALE = 192 ** -0.5


def _registry(monkeypatch, available: bool):
    monkeypatch.setattr(sm90, "availability", lambda: (True, None) if available else (False, "no"))
    reg = lk.KernelRegistry(load_plugins=None)
    registration.register(reg)
    return reg


# --------------------------------------------------------------------------------------------------
# registration


def test_availability_needs_cuda_torch_and_nvcc(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    ok, why = sm90.availability()
    assert not ok and "no CUDA" in why
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(sm90, "nvcc_path", lambda: None)
    ok, why = sm90.availability()
    assert not ok and "nvcc" in why
    monkeypatch.setattr(sm90, "nvcc_path", lambda: "/usr/local/cuda/bin/nvcc")
    assert sm90.availability() == (True, None)


def test_nvcc_path_prefers_cuda_home(monkeypatch, tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert sm90.nvcc_path() == str(tmp_path / "bin" / "nvcc")


def test_unavailable_registers_nothing(monkeypatch):
    reg = _registry(monkeypatch, available=False)
    assert sm90.KERNEL_NAME not in {s.name for s in reg.specs("mla")}
    if torch.version.cuda is None:  # this CPU machine: the installed plugin did not register it either
        assert sm90.KERNEL_NAME not in {s.name for s in lk.list_kernels("mla")}


def test_registers_for_sm90_only_below_triton_reachable_by_override(monkeypatch):
    reg = _registry(monkeypatch, available=True)
    specs = {s.name: s for s in reg.specs("mla", "decode")}
    assert lk.Priority.PORTABLE <= specs[sm90.KERNEL_NAME].priority < specs["mla_decode_triton"].priority
    traits = {"page_size": 64, "kv_dtype": "bf16"}
    assert reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, traits=traits).name == "mla_decode_triton"
    forced = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, traits=traits, override=sm90.KERNEL_NAME)
    assert forced.name == sm90.KERNEL_NAME
    assert callable(forced.impl.plan) and callable(forced.impl.run) and callable(forced.impl.workspace_bytes)
    for platform in (AMPERE, BLACKWELL, lk.CPU):  # sm_90a code runs on sm_90 alone
        with pytest.raises(lk.KernelSelectionError):
            reg.select("mla", "decode", torch.bfloat16, platform=platform, traits=traits, override=sm90.KERNEL_NAME)
    fp8 = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME,
                     features=["fp8_kv"], traits={"kv_dtype": "fp8", "page_size": 64})
    assert fp8.name == sm90.KERNEL_NAME  # both cache formats
    with pytest.raises(lk.KernelSelectionError):  # an fp16 model's queries
        reg.select("mla", "decode", torch.float16, platform=HOPPER, override=sm90.KERNEL_NAME, traits=traits)
    with pytest.raises(lk.KernelSelectionError):  # a TMA box needs >= 8 rows
        reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME,
                   traits={"page_size": 4})
    registration.register(reg)  # idempotent
    assert sum(s.name == sm90.KERNEL_NAME for s in reg.specs("mla")) == 1


# --------------------------------------------------------------------------------------------------
# planning and input checks


@pytest.mark.parametrize("heads,q_lens,lens", [(16, [4, 4, 4], [81920, 100, 4]), (128, [1, 1], [5000, 1]),
                                               (32, [3, 1], [700, 65]), (16, [16], [16])])
def test_plan_folds_tokens_into_64_row_tiles(heads, q_lens, lens):
    qsl = [0] + list(torch.tensor(q_lens).cumsum(0).tolist())
    T = qsl[-1]
    ws = torch.empty(decode_workspace_bytes(len(lens), T, heads), dtype=torch.uint8)
    p = sm90.plan(ws, qsl, lens, heads, page_size=64, softmax_scale=SCALE)
    assert p.fold and p.heads_padded == heads and p.tile == sm90.TILE
    assert p.row_tiles == -(-max(q_lens) * heads // 64)
    assert p.num_splits == sm90.num_splits_for(len(lens), max(q_lens), max(lens), heads, num_sms=4)
    assert p.seq_lens.tolist() == lens and p.query_start_loc.tolist() == qsl
    if p.num_splits > 1:
        assert p.partial_out.shape == (T, heads, p.num_splits, 512) and p.partial_lse.is_contiguous()
    fixed = sm90.plan(ws, qsl, lens, heads, page_size=64, softmax_scale=SCALE, num_splits=3)
    assert fixed.num_splits == 3 and fixed.partial_lse.shape == (T, heads, 3)


def test_splits_fill_one_wave_of_one_cta_per_sm():
    # 16 requests x 1 row tile on 132 SMs: 8 splits (128 CTAs), never 9 (144 > 132).
    assert sm90.num_splits_for(16, 4, 81920, 16, num_sms=132) == 8
    assert sm90.num_splits_for(1, 4, 81920, 16, num_sms=132) == 128  # MAX_SPLITS
    assert sm90.num_splits_for(2, 1, 81920, 128, num_sms=132) == 33  # 2 row tiles a request
    assert sm90.num_splits_for(256, 1, 81920, 16, num_sms=132) == 1


def test_plan_refuses_unknown_caches_and_small_pages():
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    assert sm90.plan(ws, [0, 1], [10], 16, page_size=64, softmax_scale=SCALE, cache_kind="fp8").cache_kind == "fp8"
    with pytest.raises(ValueError, match="cache kind"):
        sm90.plan(ws, [0, 1], [10], 16, page_size=64, softmax_scale=SCALE, cache_kind="int4")
    with pytest.raises(ValueError, match="page_size"):
        sm90.plan(ws, [0, 1], [10], 16, page_size=4, softmax_scale=SCALE)


def test_run_checks_its_inputs_before_building():
    ws = torch.empty(1 << 22, dtype=torch.uint8)
    p = sm90.plan(ws, [0, 2], [100], 16, page_size=16, softmax_scale=SCALE)
    cache = MLACache.empty(8, 16, "bf16")
    q = torch.zeros(2, 16, 576, dtype=torch.bfloat16)
    out = torch.zeros(2, 16, 512, dtype=torch.bfloat16)
    table = torch.zeros(1, 7, dtype=torch.int32)
    sm90.check_run_inputs(p, q, cache, table, out, None)  # consistent: no error
    p8 = sm90.plan(ws, [0, 2], [100], 16, page_size=16, softmax_scale=SCALE, cache_kind="fp8")
    cache8 = MLACache.empty(8, 16, "fp8")
    sm90.check_run_inputs(p8, q, cache8, table, out, None)
    with pytest.raises(ValueError, match="fp8 cache"):
        sm90.check_run_inputs(p8, q, MLACache("fp8", cache8.latent, cache8.rope.float(), cache8.scale), table, out, None)
    with pytest.raises(ValueError, match="kind"):
        sm90.check_run_inputs(p8, q, cache, table, out, None)
    triton_plan = plan_decode(ws, [0, 2], [100], 16, page_size=16, softmax_scale=SCALE)
    bad = [
        (triton_plan, q, cache, table, out, None),
        (p, q.float(), cache, table, out, None),
        (p, q[:, :8], cache, table, out, None),
        (p, q, MLACache.empty(8, 16, "fp8"), table, out, None),
        (p, q, MLACache.empty(8, 32, "bf16"), table, out, None),
        (p, q, cache, table.long(), out, None),
        (p, q, cache, table, out[..., :256], None),
        (p, q, cache, table, out, torch.zeros(2, 16, dtype=torch.float64)),
    ]
    for args in bad:
        with pytest.raises(ValueError):
            sm90.check_run_inputs(*args)


# --------------------------------------------------------------------------------------------------
# the JIT build


def test_build_options_target_sm90a_only_and_name_follows_the_sources(tmp_path, monkeypatch):
    opts = sm90.build_options(str(tmp_path))
    flags = opts["extra_cuda_cflags"]
    assert sm90.ARCH_FLAG in flags and sum("arch" in f for f in flags) == 1  # torch adds none of its own
    assert all(p.endswith(s) for p, s in zip(opts["sources"], sm90.SOURCES))
    assert all((sm90.CUDA_DIR / s).is_file() for s in sm90.SOURCES + sm90.HEADERS)  # shipped beside the module
    assert opts["build_directory"] == str(tmp_path / opts["name"])
    assert "torch/extension.h" not in (sm90.CUDA_DIR / "mla_decode_sm90.cu").read_text()  # builds standalone
    copy = tmp_path / "cuda"
    shutil.copytree(sm90.CUDA_DIR, copy)
    monkeypatch.setattr(sm90, "CUDA_DIR", copy)
    assert sm90.build_options(str(tmp_path))["name"] == opts["name"]
    with open(copy / "mla_decode_sm90.cu", "a") as f:
        f.write("\n// edited\n")
    assert sm90.build_options(str(tmp_path))["name"] != opts["name"]


def test_default_build_root_is_the_kernel_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTSPEED_KERNEL_CACHE_DIR", str(tmp_path))
    lk.refresh()
    try:
        assert sm90.default_build_root() == str(tmp_path / "mla_sm90")
    finally:
        monkeypatch.undo()
        lk.refresh()


def test_a_failed_build_raises_build_error(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    def broken(**_kw):
        raise RuntimeError("Error building extension: mla_decode_sm90.cu(1): error: nope")

    monkeypatch.setattr(cpp_extension, "load", broken)
    monkeypatch.setattr(sm90, "_extension", None)
    with pytest.raises(sm90.BuildError, match="error: nope"):
        sm90.load_extension(str(tmp_path))


@pytest.mark.skipif(sm90.nvcc_path() is None, reason="needs nvcc")
def test_kernel_compiles_for_sm90a_without_spills(tmp_path):
    # The kernel file alone (no torch headers); ptxas reports registers, spills and barriers.
    cmd = [sm90.nvcc_path(), sm90.ARCH_FLAG, "-std=c++17", "-O3", "-Xptxas", "-v", "-c",
           str(sm90.CUDA_DIR / "mla_decode_sm90.cu"), "-o", str(tmp_path / "k.o")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stderr
    assert "mla_decode_sm90_bf16_kernel" in report and "mla_decode_sm90_fp8_kernel" in report
    assert len(re.findall(r"0 bytes spill stores, 0 bytes spill loads", report)) == 2, report
    assert "serialized" not in report, report  # ptxas' wgmma serialisation warning
