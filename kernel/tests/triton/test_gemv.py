"""The skinny GEMM (triton_gemv) against F.linear in float64: both inner products, split-K on and
off, ragged N and K, bias, bf16 / fp16, 1..64 rows (x tiles of 16 / 32 / 64 on the dot's N side), the
fallback above 64 rows, and its opt-in registration."""

import lightspeed_kernel as lk
import pytest
import torch
import torch.nn.functional as F
from lightspeed_kernel.registry.platform import Platform
from lightspeed_kernel.triton import gemv
from lightspeed_kernel.triton.gemv import GemvConfig
from tk_helpers import TOL, rel_err

# Small tiles so the interpreter's shapes are ragged against them: N = 40 / 24 is not a multiple of
# BLOCK_N 16 / 32, K = 72 / 40 not of BLOCK_K 32 / 64; split 3 over K = 40 leaves the last split empty.
CONFIGS = {
    "fma": GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4, num_stages=1, use_dot=False),
    "fma_split3": GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=3, use_dot=False),
    "dot": GemvConfig(block_n=32, block_k=64, split_k=1, num_warps=4, num_stages=3, use_dot=True),
    "dot_split2": GemvConfig(block_n=16, block_k=32, split_k=2, num_warps=4, num_stages=4, use_dot=True),
}
SHAPES = [(40, 72), (24, 40)]  # (N, K)
ROWS = {"fma": (1, 3), "dot": (1, 3, 8, 16, 17, 33, 64)}  # the FMA path is swept up to 4 rows only


def _case(m, n, k, dtype, bias, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    return x, w, b


def _exact(x, w, b):
    return x.double() @ w.double().t() + (b.double() if b is not None else 0.0)


@pytest.mark.parametrize("name,m", [(c, m) for c in CONFIGS for m in ROWS[c.split("_")[0]]])
@pytest.mark.parametrize("dtype,bias", [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float16, True)],
                         ids=["bf16-bias", "bf16", "fp16-bias"])
def test_matches_reference(device, name, m, dtype, bias):
    for n, k in SHAPES:
        x, w, b = _case(m, n, k, dtype, bias, device, seed=m * n + k)
        got = gemv.linear(x, w, b, config=CONFIGS[name])
        assert got.shape == (m, n) and got.dtype == dtype
        assert rel_err(got, _exact(x, w, b)) < TOL[dtype], (n, k)


@pytest.mark.parametrize("name,m", [(c, m) for c in CONFIGS for m in ROWS[c.split("_")[0]][:2]])
def test_weight_prefetch_before_the_pdl_wait_gives_the_same_bits(device, name, m):
    # under PDL the first weight tile is loaded ahead of the loop; the sums keep their order
    for n, k in SHAPES:
        x, w, b = _case(m, n, k, torch.bfloat16, True, device, seed=m + n)
        plain = gemv.launch(x, w, b, CONFIGS[name], prefetch_weights=False)
        ahead = gemv.launch(x, w, b, CONFIGS[name], prefetch_weights=True)
        assert torch.equal(plain, ahead), (n, k)
        assert rel_err(ahead, _exact(x, w, b)) < TOL[torch.bfloat16], (n, k)


@pytest.mark.parametrize("m", [1, 3, 16, 40, 64])
def test_default_config(device, m):
    x, w, b = _case(m, 48, 136, torch.bfloat16, True, device)
    assert gemv.takes(x, w, b)
    assert rel_err(gemv.linear(x, w, b), _exact(x, w, b)) < TOL[torch.bfloat16]


def test_x_tiles_pad_rows_to_the_dot_minimum_or_the_next_power_of_two():
    dot, fma = CONFIGS["dot"], CONFIGS["fma"]
    assert [dot.block_m(m) for m in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    assert [fma.block_m(m) for m in (1, 3, 4)] == [1, 4, 4]


def test_split_workspace_is_used_and_the_sum_is_deterministic(device):
    cfg = CONFIGS["dot_split2"]
    x, w, b = _case(3, 40, 72, torch.bfloat16, True, device)
    ws = torch.full((gemv.workspace_elements(3, 40, cfg) + 5,), float("nan"), device=device)
    first = gemv.linear(x, w, b, config=cfg, workspace=ws)
    assert not torch.isnan(ws[: gemv.workspace_elements(3, 40, cfg)]).any()  # every partial written
    assert torch.equal(first, gemv.linear(x, w, b, config=cfg, workspace=ws))
    assert rel_err(first, _exact(x, w, b)) < TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="workspace"):
        gemv.linear(x, w, b, config=cfg, workspace=ws[:10])


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("the skinny GEMM launched for a call it must hand to F.linear")


@pytest.mark.parametrize("why", ["65 rows", "no rows", "fp32", "mixed dtypes", "strided weight", "grad"])
def test_calls_it_does_not_take_go_to_f_linear(device, monkeypatch, why):
    x, w, b = _case(65 if why == "65 rows" else 0 if why == "no rows" else 4, 24, 40, torch.bfloat16, True, device)
    if why == "fp32":
        x, w, b = x.float(), w.float(), b.float()
    elif why == "mixed dtypes":
        w = w.half()
    elif why == "strided weight":
        w = w.t().contiguous().t()  # [N, K] view with K strided
    elif why == "grad":
        w.requires_grad_(True)
    assert not gemv.takes(x, w, b)
    monkeypatch.setattr(gemv, "_skinny_gemm_kernel", _NoLaunch())
    if why == "mixed dtypes":
        with pytest.raises(RuntimeError):  # F.linear's own error, not a silent cast
            gemv.linear(x, w, b)
        return
    got = gemv.linear(x, w, b)
    assert torch.equal(got, F.linear(x, w, b))
    assert got.requires_grad == (why == "grad")


def test_sixteen_rows_take_the_kernel(device, monkeypatch):
    x, w, b = _case(16, 24, 40, torch.float16, False, device)
    assert gemv.takes(x, w, b)
    monkeypatch.setattr(gemv, "_skinny_gemm_kernel", _NoLaunch())
    with pytest.raises(AssertionError, match="launched"):
        gemv.linear(x, w, b)


LLAMA_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 32, 64])
def test_choose_config_is_the_first_of_its_sweep_space(m):
    for n, k in LLAMA_8B:
        chosen = gemv.choose_config(m, n, k, 132)
        space = gemv.sweep_configs(m, n, k, 132)
        assert space[0] == chosen and len(set(space)) == len(space) > 10
        assert all(c.smem_bytes(m) <= gemv.SMEM_BUDGET and c.split_k in (1, 2, 4, 8) for c in space)
        # the fp32 accumulator stays within 64 elements a thread (the tile's rows padded for the dot)
        assert all(c.block_n * c.block_m(m) <= 64 * 32 * c.num_warps for c in space if c.use_dot)
        if (m, n, k) in gemv.MEASURED_H200:
            assert chosen == gemv.MEASURED_H200[m, n, k]
        else:
            assert chosen.use_dot == (m > 2)
        if n * k > 4096 * 4096 * 4:  # gate_up, lm_head: enough column blocks without splitting K
            assert chosen.split_k == 1


def test_unmeasured_shapes_split_k_only_below_one_wave():
    # 256 column blocks of 16 fill 132 SMs: no split (the H200 sweep: split o_proj was 5.8x slower)
    assert gemv.choose_config(1, 4096, 4096, 100).split_k == 1
    # 64 column blocks (a 1024-wide KV projection) leave SMs idle: split along K
    assert gemv.choose_config(1, 1024, 4096, 132).split_k == 2  # each split keeps four K steps of 512
    assert gemv.choose_config(1, 1024, 4096, 1).split_k == 1
    # the measured table is the H200's: another SM count gets the rule
    assert gemv.choose_config(1, 4096, 4096, 100) != gemv.MEASURED_H200[1, 4096, 4096]


SM90 = Platform.parse("sm_90")


def test_one_row_default_any_rows_opt_in():
    # fp32 selects it too and goes to F.linear inside (`takes` refuses it)
    for dtype in ("bfloat16", "float16", "float32"):
        assert lk.select_kernel("gemm", "bf16", dtype, platform=SM90).name == gemv.ONE_ROW_KERNEL_NAME
    for dtype in ("bfloat16", "float16", "float32"):
        assert lk.select_kernel("gemm", "bf16", dtype, platform=SM90, override=gemv.KERNEL_NAME).name == "triton_gemv"
        assert lk.select_kernel("gemm", "bf16", dtype, platform=Platform.parse("cpu")).name == "reference"
    with lk.override(**{"gemm/bf16": "triton_gemv"}):
        assert lk.select_kernel("gemm", "bf16", "bfloat16", platform=SM90).name == "triton_gemv"
    spec = {s.name: s for s in lk.list_kernels("gemm", "bf16")}
    assert spec["triton_gemv"].priority < spec["cublas_linear"].priority < spec[gemv.ONE_ROW_KERNEL_NAME].priority
    assert lk.select_kernel("gemm", "bf16", "bfloat16", platform=Platform.parse("rocm:9.4")).name == "reference"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16, 24, 32, 64])
def test_gpu_8b_shapes_through_the_override(m):
    # (tools/bench/gemv.py checks every config of the sweep the same way)
    for n, k in LLAMA_8B[:4]:
        x, w, b = _case(m, n, k, torch.bfloat16, m % 2 == 0, "cuda", seed=n)
        with lk.override(**{"gemm/bf16": gemv.KERNEL_NAME}):
            got = lk.ops.linear(x, w, b)
        assert rel_err(got, _exact(x, w, b)) < TOL[torch.bfloat16], (n, k)


@pytest.mark.gpu
def test_gpu_split_k_replays_under_a_cuda_graph():
    x, w, b = _case(4, 4096, 14336, torch.bfloat16, True, "cuda")
    cfg = gemv.choose_config(4, 4096, 14336, torch.cuda.get_device_properties(0).multi_processor_count)
    assert cfg.split_k > 1
    ws = torch.empty(gemv.workspace_elements(4, 4096, cfg), device="cuda")
    gemv.linear(x, w, b, config=cfg, workspace=ws)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv.linear(x, w, b, config=cfg, workspace=ws)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_err(out, _exact(x, w, b)) < TOL[torch.bfloat16]


def test_one_row_variant_takes_one_row_only(device):
    assert lk.select_kernel("gemm", "bf16", "bfloat16", platform=SM90,
                            override=gemv.ONE_ROW_KERNEL_NAME).name == gemv.ONE_ROW_KERNEL_NAME
    for m in (1, 2, 16):  # the interpreter takes any one-row shape; a GPU only measured-size ones
        x, w, b = _case(m, 48, 136, torch.bfloat16, True, device, seed=m)
        assert gemv.takes_one_row(x, w, b) is (m == 1 and device == "cpu")
        assert rel_err(gemv.linear_one_row(x, w, b), _exact(x, w, b)) < TOL[torch.bfloat16]
    if device == "cuda":
        on_h200 = torch.cuda.get_device_properties(0).multi_processor_count == gemv.H200_SMS
        for n, k in LLAMA_8B[:2] + [(49152, 4096)]:
            x, w, b = _case(1, n, k, torch.bfloat16, False, device, seed=n)
            assert gemv.takes_one_row(x, w, b) is on_h200
            assert rel_err(gemv.linear_one_row(x, w, b), _exact(x, w, b)) < TOL[torch.bfloat16]
