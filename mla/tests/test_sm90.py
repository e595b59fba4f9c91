"""The sm_90a CUDA decode kernel's host side on the CPU: registration gating, planning, input checks,
the JIT build command, and (where nvcc is installed) an sm_90a compile of the kernel with ptxas'
resource report. The kernel's numbers are tested on the GPU (test_sm90_gpu.py)."""

import os
import re
import shutil
import subprocess

import pytest
import torch
from lightspeed_mla import MLACache, decode_workspace_bytes, plan_decode, registration, sm90
from lightspeed_mla.reference import quantize_q_latent_e4m3

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


def test_registers_for_sm90_only_above_triton_fp8qk_by_override(monkeypatch):
    reg = _registry(monkeypatch, available=True)
    specs = {s.name: s for s in reg.specs("mla", "decode")}
    assert specs[sm90.KERNEL_NAME].priority == lk.Priority.of(lk.Priority.PLUGIN, 1)
    assert specs[sm90.KERNEL_NAME].priority > specs["mla_decode_triton"].priority
    assert specs[sm90.KERNEL_NAME_FP8_SCORES].priority < specs["mla_decode_triton"].priority  # opt-in
    traits = {"page_size": 64, "kv_dtype": "bf16"}
    assert reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, traits=traits).name == sm90.KERNEL_NAME
    fp8_traits = {"page_size": 64, "kv_dtype": "fp8"}
    assert reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, features=["paged", "fp8_kv"],
                      traits=fp8_traits).name == sm90.KERNEL_NAME
    for platform in (AMPERE, BLACKWELL):  # elsewhere Triton, as before
        assert reg.select("mla", "decode", torch.bfloat16, platform=platform, traits=traits).name == "mla_decode_triton"
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
    qk = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME_FP8_SCORES,
                    features=["fp8_kv"], traits={"kv_dtype": "fp8", "page_size": 64})
    assert qk.impl.fp8_scores and not forced.impl.fp8_scores
    with pytest.raises(lk.KernelSelectionError):  # the e4m3-scores variant is for FP8 caches only
        reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME_FP8_SCORES, traits=traits)
    registration.register(reg)  # idempotent
    assert sum(s.name == sm90.KERNEL_NAME for s in reg.specs("mla")) == 1
    assert sum(s.name == sm90.KERNEL_NAME_FP8_SCORES for s in reg.specs("mla")) == 1
    assert sum(s.name == sm90.KERNEL_NAME_FP8_MMA for s in reg.specs("mla")) == 1


def test_the_all_e4m3_variant_is_fp8_only_and_opt_in(monkeypatch):
    reg = _registry(monkeypatch, available=True)
    specs = {s.name: s for s in reg.specs("mla", "decode")}
    assert specs[sm90.KERNEL_NAME_FP8_MMA].priority < specs["mla_decode_triton"].priority  # unmeasured: opt-in
    fp8_traits = {"kv_dtype": "fp8", "page_size": 64}
    mma = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME_FP8_MMA,
                     features=["fp8_kv"], traits=fp8_traits)
    assert mma.impl.fp8_scores and mma.impl.fp8_pv
    qk = reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME_FP8_SCORES,
                    features=["fp8_kv"], traits=fp8_traits)
    assert not qk.impl.fp8_pv
    with pytest.raises(lk.KernelSelectionError):
        reg.select("mla", "decode", torch.bfloat16, platform=HOPPER, override=sm90.KERNEL_NAME_FP8_MMA,
                   traits={"kv_dtype": "bf16", "page_size": 64})


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
    with pytest.raises(ValueError, match="aligned"):
        sm90.plan(ws[8:], [0, 1], [10], 16, page_size=64, softmax_scale=SCALE)


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
        (p, torch.zeros(2, 16, 580, dtype=torch.bfloat16)[..., :576], cache, table, out, None),  # rows 8-byte aligned
        (p, q, cache, table, torch.zeros(2 * 16 * 512 + 4, dtype=torch.bfloat16)[4:].view(2, 16, 512), None),
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
    assert all(p.endswith(s) for p, s in zip(opts["sources"], sm90.SOURCES, strict=True))
    assert all((sm90.CUDA_DIR / s).is_file() for s in sm90.SOURCES + sm90.HEADERS)  # shipped beside the module
    assert opts["build_directory"] == str(tmp_path / opts["name"])
    for name in sm90.KERNEL_SOURCES:  # each builds standalone with nvcc
        assert "torch/extension.h" not in (sm90.CUDA_DIR / name).read_text()
    copy = tmp_path / "cuda"
    shutil.copytree(sm90.CUDA_DIR, copy)
    monkeypatch.setattr(sm90, "CUDA_DIR", copy)
    assert sm90.build_options(str(tmp_path))["name"] == opts["name"]
    with open(copy / "sm90_decode_tile.cuh", "a") as f:  # a header's edit rebuilds too
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


def test_a_first_build_says_so_and_a_cached_one_is_quiet(monkeypatch, tmp_path, caplog):
    import logging

    from torch.utils import cpp_extension

    def build(**kw):  # what torch leaves behind: <build_directory>/<name>.so
        open(os.path.join(kw["build_directory"], f"{kw['name']}.so"), "w").close()
        return "module"

    monkeypatch.setattr(cpp_extension, "load", build)
    for expected in ("building for sm_90a", None):
        monkeypatch.setattr(sm90, "_extensions", {})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lightspeed.mla"):
            assert sm90.load_extension(str(tmp_path)) == "module"
        assert (expected in caplog.text and "built in" in caplog.text) if expected else caplog.text == ""
    monkeypatch.setattr(sm90, "_extensions", {})


def test_a_build_lock_left_by_a_killed_build_is_removed(monkeypatch, tmp_path, caplog):
    # torch waits forever on <build_dir>/lock; one left by a process killed mid-build must not hang us.
    import logging

    from torch.utils import cpp_extension

    build_dir = sm90.build_options(str(tmp_path))["build_directory"]
    os.makedirs(build_dir)
    open(os.path.join(build_dir, "lock"), "w").close()
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: "module" if not os.path.exists(
        os.path.join(kw["build_directory"], "lock")) else pytest.fail("built with the stale lock in place"))
    monkeypatch.setattr(sm90, "_extensions", {})
    with caplog.at_level(logging.WARNING, logger="lightspeed.mla"):
        assert sm90.load_extension(str(tmp_path)) == "module"
    assert "interrupted build" in caplog.text


def test_a_failed_build_raises_build_error(monkeypatch, tmp_path):
    from torch.utils import cpp_extension

    def broken(**_kw):
        raise RuntimeError("Error building extension: mla_decode_sm90.cu(1): error: nope")

    calls = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: calls.append(1) or broken(**kw))
    monkeypatch.setattr(sm90, "_extensions", {})
    monkeypatch.setattr(sm90, "_failures", {})
    for _ in range(2):  # the second call answers with the first failure, without building again
        with pytest.raises(sm90.BuildError, match="error: nope"):
            sm90.load_extension(str(tmp_path))
    assert len(calls) == 1


def test_the_phase_timer_build_is_a_module_of_its_own(monkeypatch, tmp_path):
    plain, timed = sm90.build_options(str(tmp_path)), sm90.build_options(str(tmp_path), phase_timers=True)
    assert timed["name"] == plain["name"] + "_timers" and timed["build_directory"] != plain["build_directory"]
    for key in ("extra_cflags", "extra_cuda_cflags"):  # both sides must see MlaSm90Args alike
        assert sm90.TIMERS_DEFINE in timed[key] and sm90.TIMERS_DEFINE not in plain[key]
    from torch.utils import cpp_extension

    built = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: built.append(kw["name"]) or kw["name"])
    monkeypatch.setattr(sm90, "_extensions", {})
    assert sm90.load_extension(str(tmp_path), phase_timers=True) == timed["name"]
    assert sm90.load_extension(str(tmp_path)) == plain["name"]
    assert sm90.load_extension(str(tmp_path), phase_timers=True) == timed["name"] and len(built) == 2  # cached
    monkeypatch.setattr(sm90, "_extensions", {})


def test_phase_names_follow_the_kernels_enum():
    header = (sm90.CUDA_DIR / "mla_decode_sm90.h").read_text()
    start = header.index("enum MlaPhase")
    enum = header[start:header.index("kNumPhases", start)]
    names = re.findall(r"kPhase(\w+),", enum)
    assert [re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower() for n in names] == list(sm90.PHASES)


def test_counter_names_follow_the_kernels_enum():
    header = (sm90.CUDA_DIR / "mla_decode_sm90.h").read_text()
    start = header.index("enum MlaCounter")
    names = re.findall(r"kCount(\w+),", header[start:header.index("kNumCounters", start)])
    assert [re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower() for n in names] == list(sm90.COUNTERS)


def _ptxas_report(tmp_path, *defines: str) -> str:
    # The kernel files alone (no torch headers), in parallel; ptxas reports registers, spills and barriers.
    procs = [subprocess.Popen([sm90.nvcc_path(), sm90.ARCH_FLAG, "-std=c++17", "-O3", *defines, "-Xptxas", "-v",
                               "-c", str(sm90.CUDA_DIR / name), "-o", str(tmp_path / f"{name}.o")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in sm90.KERNEL_SOURCES]
    report = ""
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        report += err
    assert "mla_decode_sm90_bf16_kernel" in report and "mla_decode_sm90_fp8_kernel" in report
    assert "mla_decode_sm90_fp8mma_kernel" in report
    assert "serialized" not in report, report  # ptxas' wgmma serialisation warning
    return report


@pytest.mark.skipif(sm90.nvcc_path() is None, reason="needs nvcc")
def test_kernel_compiles_for_sm90a_without_spills(tmp_path):
    report = _ptxas_report(tmp_path)
    assert len(re.findall(r"0 bytes spill stores, 0 bytes spill loads", report)) == 4, report  # bf16, fp8 x 3
    assert re.findall(r"Used (\d+) registers", report) == ["168"] * 4, report  # the 384-thread launch share


@pytest.mark.skipif(sm90.nvcc_path() is None, reason="needs nvcc")
def test_the_phase_timer_build_compiles_without_spills(tmp_path):
    report = _ptxas_report(tmp_path, sm90.TIMERS_DEFINE)
    assert "globaltimer_mark_kernel" in report
    assert len(re.findall(r"0 bytes spill stores, 0 bytes spill loads", report)) == 5, report  # + the mark kernel


def _torch_and_cuda_includes(tmp_path) -> list[str] | None:
    """-I flags for compiling binding.cpp on this machine: torch's headers, Python's, CUDA's (None without
    CUDA headers). A CPU build of torch lacks c10/cuda/impl/cuda_cmake_macros.h (CMake writes it for CUDA
    builds), so an empty one stands in: the binding only needs its declarations, not a CUDA torch."""
    import sysconfig

    cuda = next((d for d in ("/usr/local/cuda/include",) if os.path.isfile(os.path.join(d, "cuda.h"))), None)
    if cuda is None or shutil.which("g++") is None:
        return None
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    torch_inc = os.path.join(os.path.dirname(torch.__file__), "include")
    return [f"-I{tmp_path / 'stub'}", f"-I{torch_inc}", f"-I{torch_inc}/torch/csrc/api/include",
            f"-I{sysconfig.get_paths()['include']}", f"-I{cuda}", f"-I{sm90.CUDA_DIR}"]


@pytest.mark.parametrize("timers", [False, True], ids=["production", "phase_timers"])
def test_binding_compiles_against_torch_headers(tmp_path, timers):
    # The JIT build compiles binding.cpp only on the GPU machine; this catches a C++ error here first.
    includes = _torch_and_cuda_includes(tmp_path)
    if includes is None:
        pytest.skip("needs g++ and CUDA headers")
    cmd = ["g++", "-fsyntax-only", "-std=c++20", "-DTORCH_EXTENSION_NAME=lightspeed_mla_sm90", *includes,
           *([sm90.TIMERS_DEFINE] if timers else []), str(sm90.CUDA_DIR / "binding.cpp")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


# --------------------------------------------------------------------------------------------------
# run()'s plumbing on the CPU: a stand-in for the built module with the binding's signature, doing the
# kernel's per-split math in torch; the real Triton combine (interpreter) merges its partials.


def _binding_params() -> list[str]:
    text = (sm90.CUDA_DIR / "binding.cpp").read_text()
    args = text[text.index("void decode(") + len("void decode("):text.index(") {", text.index("void decode("))]
    return [a.split()[-1].lstrip("&*") for a in args.split(",")]


class _KernelStandIn:
    """`decode` of cuda/binding.cpp in torch: each split's rows over keys [start, min(start + per_split,
    row_end)) as the kernel cuts them, normalised partials and log2-LSE, or the output when unsplit."""

    def __init__(self):
        self.calls = []

    def decode(self, q, kv, rope, scale, page_table, seq_lens, query_start, out, lse, partial_out, partial_lse,
               batch, row_tiles, num_splits, scale_log2, fp8_scores, fp8_pv, phase_ns):
        self.calls.append({"fp8": rope is not None, "fp8_scores": fp8_scores, "fp8_pv": fp8_pv, "splits": num_splits})
        self.phase_ns = phase_ns
        assert isinstance(fp8_scores, bool) and isinstance(fp8_pv, bool) and isinstance(num_splits, int)
        assert (rope is None) == (scale is None) and (not fp8_pv or fp8_scores)
        H = q.shape[1]
        if rope is None:
            latent, rope_k = kv[..., :512].float(), kv[..., 512:].float()
        else:
            latent, rope_k = kv.float() * scale, rope.float()
        latent, rope_k = latent.reshape(-1, 512), rope_k.reshape(-1, 64)
        qf = quantize_q_latent_e4m3(q) if fp8_scores else q.float()
        ps = kv.shape[1]
        for b in range(batch):
            q0, q1, kv_len = int(query_start[b]), int(query_start[b + 1]), int(seq_lens[b])
            pos = torch.arange(kv_len)
            slots = page_table[b, pos // ps].long() * ps + pos % ps
            k = torch.cat([latent[slots], rope_k[slots]], -1)  # [L, 576]
            per_split = (kv_len + num_splits - 1) // num_splits
            per_split = (per_split + 63) // 64 * 64  # 64-aligned, as the kernel cuts them
            for t in range(q0, q1):
                row_end = kv_len - (q1 - q0) + (t - q0) + 1
                s2 = (qf[t] @ k.T) * scale_log2  # [H, L]
                for split in range(num_splits):
                    lo, hi = split * per_split, min(split * per_split + per_split, row_end)
                    if hi > lo:
                        m = s2[:, lo:hi].amax(-1, keepdim=True)
                        p = torch.exp2(s2[:, lo:hi] - m)
                        o, lse2 = (p @ latent[slots[lo:hi]]) / p.sum(-1, keepdim=True), m[:, 0] + torch.log2(p.sum(-1))
                    else:
                        o, lse2 = torch.zeros(H, 512), torch.full((H,), float("-inf"))
                    if num_splits == 1:
                        out[t] = o.to(out.dtype)
                        if lse is not None:
                            lse[t] = lse2 * 0.6931471805599453
                    else:
                        partial_out[t, :, split] = o
                        partial_lse[t, :, split] = lse2


def test_the_stand_in_has_the_bindings_signature():
    import inspect

    assert list(inspect.signature(_KernelStandIn.decode).parameters)[1:] == _binding_params()


@pytest.mark.parametrize("kind,fp8_scores,fp8_pv", [("bf16", False, False), ("fp8", False, False),
                                                     ("fp8", True, False), ("fp8", True, True)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_run_plumbing_against_the_reference(monkeypatch, kind, fp8_scores, fp8_pv, num_splits):
    from lightspeed_mla import mla_decode_reference
    from mla_helpers import make_paged_cache, query_start, rel_err

    stand_in = _KernelStandIn()
    monkeypatch.setattr(sm90, "load_extension", lambda *a, **k: stand_in)
    g = torch.Generator().manual_seed(num_splits)
    lens, q_len, H = [70, 200, 5], 2, 4
    cache, table = make_paged_cache(kind, 16, lens, generator=g)
    qsl = query_start([q_len] * len(lens))
    q = torch.randn(int(qsl[-1]), H, 576, generator=g).to(torch.bfloat16)
    out, lse = sm90.mla_decode_sm90(q, cache, table, torch.tensor(lens), qsl, SCALE, return_lse=True,
                                    num_splits=num_splits, fp8_scores=fp8_scores, fp8_pv=fp8_pv)
    assert stand_in.calls == [{"fp8": kind == "fp8", "fp8_scores": fp8_scores, "fp8_pv": fp8_pv,
                               "splits": num_splits}]
    assert stand_in.phase_ns is None  # the production build
    q_ref = q.float()
    if fp8_scores:  # the reference with Q as the kernel quantises it
        q_ref = quantize_q_latent_e4m3(q)
    ref, ref_lse = mla_decode_reference(q_ref, cache, table, torch.tensor(lens), qsl, SCALE)
    assert rel_err(out, ref) < 1e-2
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)


def test_e4m3_pv_needs_e4m3_scores(monkeypatch):
    from mla_helpers import make_paged_cache, query_start

    monkeypatch.setattr(sm90, "load_extension", lambda *a, **k: _KernelStandIn())
    cache, table = make_paged_cache("fp8", 16, [70], generator=torch.Generator().manual_seed(0))
    q = torch.randn(1, 4, 576).to(torch.bfloat16)
    with pytest.raises(ValueError, match="fp8_pv"):
        sm90.mla_decode_sm90(q, cache, table, torch.tensor([70]), query_start([1]), SCALE, fp8_pv=True)


def test_run_with_a_phase_buffer_uses_the_timer_build(monkeypatch):
    from mla_helpers import make_paged_cache, query_start

    stand_in, asked = _KernelStandIn(), []
    monkeypatch.setattr(sm90, "load_extension", lambda *a, phase_timers=False, **k: asked.append(phase_timers) or stand_in)
    lens, H = [70, 200], 4
    cache, table = make_paged_cache("bf16", 16, lens, generator=torch.Generator().manual_seed(0))
    qsl = query_start([2, 2])
    ws = torch.empty(decode_workspace_bytes(2, 4, H, 3), dtype=torch.uint8)
    p = sm90.plan(ws, qsl, lens, H, page_size=16, softmax_scale=SCALE, num_splits=3)
    buf = sm90.phase_timer_buffer(p)
    assert buf.shape == (2 * p.row_tiles * 3, len(sm90.PHASES) + len(sm90.COUNTERS)) and buf.dtype == torch.int64 and not buf.any()
    q, out = torch.randn(4, H, 576).to(torch.bfloat16), torch.empty(4, H, 512, dtype=torch.bfloat16)
    sm90.run(p, q, cache, table, out, phase_ns=buf)
    assert asked == [True] and stand_in.phase_ns is buf
    sm90.run(p, q, cache, table, out)
    assert asked == [True, False] and stand_in.phase_ns is None
