"""The norm folded into the one-row GEMM (triton_rms_norm_gemv) against the unfused reference: with and
without a residual (and the new residual it writes), bias, ragged N and K, the weight prefetch of PDL
launches, and the composition it hands every other call to."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel.reference.norm import rms_norm_linear as reference
from lightspeed_kernel.triton import norm_gemv
from lightspeed_kernel.triton.gemv import GemvConfig
from tk_helpers import TOL, rel_err

CONFIGS = {  # small tiles: N = 40 and K = 72 are ragged against both
    "n16k32": GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4, num_stages=1, use_dot=False),
    "n32k64s3": GemvConfig(block_n=32, block_k=64, split_k=1, num_warps=4, num_stages=3, use_dot=False),
}


def _case(n, k, residual, bias, device, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=g).to(dtype).to(device)
    r = torch.randn(1, k, generator=g).to(dtype).to(device) if residual else None
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(dtype).to(device)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    return x, r, nw, w, b


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("residual,bias", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("n,k", [(40, 72), (24, 200)])
def test_matches_the_unfused_reference(device, config, residual, bias, prefetch, n, k):
    x, r, nw, w, b = _case(n, k, residual, bias, device, seed=n + k)
    r_before = None if r is None else r.clone()
    assert norm_gemv.takes(x, r, nw, w, b)
    out, h = norm_gemv.launch(x, r, nw, 1e-5, w, b, config=CONFIGS[config], prefetch_weights=prefetch)
    want_out, want_h = reference(x, None if r is None else r.clone(), nw, 1e-5, w, b)
    assert out.shape == (1, n) and out.dtype == x.dtype
    assert rel_err(out, want_out) < TOL[torch.bfloat16]
    # the residual stream is rounded as the unfused add rounds it (the interpreter's fp32 -> bf16 cast
    # truncates, so on the CPU only to within one bf16 step)
    assert torch.equal(h, want_h) if device == "cuda" else rel_err(h, want_h) < TOL[torch.bfloat16]
    if r is not None:
        assert torch.equal(r, r_before)  # read, never written: other programs may still be reading it


def test_prefetch_gives_the_same_bits(device):
    x, r, nw, w, b = _case(40, 72, True, True, device)
    a, _ = norm_gemv.launch(x, r, nw, 1e-5, w, b, config=CONFIGS["n32k64s3"], prefetch_weights=False)
    c, _ = norm_gemv.launch(x, r, nw, 1e-5, w, b, config=CONFIGS["n32k64s3"], prefetch_weights=True)
    assert torch.equal(a, c)


@pytest.mark.parametrize("what", ["two rows", "fp32", "strided weight"])
def test_other_calls_go_to_the_composition(device, what):
    rows, dtype = (2, torch.bfloat16) if what == "two rows" else (1, torch.float32 if what == "fp32" else torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 64, generator=g).to(dtype).to(device)
    r = torch.randn(rows, 64, generator=g).to(dtype).to(device)
    nw = torch.ones(64, dtype=dtype, device=device)
    w = torch.randn(48, 64, generator=g).to(dtype).to(device)
    if what == "strided weight":
        w = torch.randn(64, 48, generator=g).to(dtype).to(device).t()
    assert not norm_gemv.takes(x, r, nw, w, None)
    out, h = norm_gemv.rms_norm_linear(x, r.clone(), nw, 1e-5, w)
    want_out, want_h = reference(x, r.clone(), nw, 1e-5, w)
    assert rel_err(out, want_out) < TOL[dtype] and rel_err(h, want_h) < TOL[dtype]


def test_opt_in_below_the_composition():
    ranks = {s.name: s.priority for s in lk.list_kernels("norm", "rms_linear")}
    assert ranks["reference"] < ranks[norm_gemv.KERNEL_NAME] < ranks["composed_rms_norm_linear"]


@pytest.mark.gpu
@pytest.mark.parametrize("n", [6144, 28672, 128256])
def test_gpu_8b_projections_match_and_replay_under_a_cuda_graph(n):
    if torch.cuda.get_device_properties(0).multi_processor_count != norm_gemv.H200_SMS:
        pytest.skip("the one-row launches are an H200's")
    x, r, nw, w, _ = _case(n, 4096, True, False, "cuda", seed=n)
    out, h = norm_gemv.rms_norm_linear(x, r, nw, 1e-5, w)  # compiles outside the capture
    want_out, want_h = reference(x, r.clone(), nw, 1e-5, w)
    assert rel_err(out, want_out) < TOL[torch.bfloat16] and torch.equal(h, want_h)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, h = norm_gemv.rms_norm_linear(x, r, nw, 1e-5, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    want_out, want_h = reference(x, r.clone(), nw, 1e-5, w)
    assert rel_err(out, want_out) < TOL[torch.bfloat16] and torch.equal(h, want_h)
