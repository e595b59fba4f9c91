"""SiLU-and-mul folded into the one-row down projection (triton_silu_and_mul_gemv) against the unfused
reference and the skinny GEMM it mirrors: bias, ragged N and I, the weight prefetch of PDL launches,
and the composition it hands every other call to."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel.reference.activation import silu_and_mul
from lightspeed_kernel.reference.activation import silu_and_mul_linear as reference
from lightspeed_kernel.triton import act_gemv, gemv
from lightspeed_kernel.triton.gemv import GemvConfig
from tk_helpers import TOL, rel_err

CONFIGS = {  # small tiles: N = 40 and I = 72 are ragged against both
    "n16k32": GemvConfig(block_n=16, block_k=32, split_k=1, num_warps=4, num_stages=1, use_dot=False),
    "n32k64s3": GemvConfig(block_n=32, block_k=64, split_k=1, num_warps=4, num_stages=3, use_dot=False),
}


def _case(n, inter, bias, device, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2 * inter, generator=g).to(dtype).to(device)
    w = (torch.randn(n, inter, generator=g) / inter**0.5).to(dtype).to(device)
    b = torch.randn(n, generator=g).to(dtype).to(device) if bias else None
    return x, w, b


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("n,inter", [(40, 72), (24, 200)])
def test_matches_the_unfused_reference(device, config, bias, prefetch, n, inter):
    x, w, b = _case(n, inter, bias, device, seed=n + inter)
    assert act_gemv.takes(x, w, b)
    got = act_gemv.launch(x, w, b, config=CONFIGS[config], prefetch_weights=prefetch)
    assert got.shape == (1, n) and got.dtype == x.dtype
    assert rel_err(got, reference(x, w, b)) < TOL[torch.bfloat16]
    # the skinny GEMM over the rounded activation, same tiles: the same sums
    plain = gemv.launch(silu_and_mul(x), w, b, CONFIGS[config], prefetch_weights=prefetch)
    assert rel_err(got, plain) < TOL[torch.bfloat16]


@pytest.mark.parametrize("what", ["two rows", "fp32", "odd width"])
def test_other_calls_go_to_the_composition(device, what):
    rows, dtype = (2, torch.bfloat16) if what == "two rows" else (1, torch.float32 if what == "fp32" else torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 128, generator=g).to(dtype).to(device)
    w = torch.randn(48, 64 if what != "odd width" else 60, generator=g).to(dtype).to(device)
    assert not act_gemv.takes(x, w, None)
    if what == "odd width":  # [gate | up] is not twice the weight's width: not a call it can fuse
        return
    assert rel_err(act_gemv.silu_and_mul_linear(x, w), reference(x, w)) < TOL[dtype]


def test_opt_in_below_the_composition():
    ranks = {s.name: s.priority for s in lk.list_kernels("activation", "silu_and_mul_linear")}
    assert ranks["reference"] < ranks[act_gemv.KERNEL_NAME] < ranks["composed_silu_and_mul_linear"]


@pytest.mark.gpu
def test_gpu_8b_down_projection_matches_and_replays_under_a_cuda_graph():
    if torch.cuda.get_device_properties(0).multi_processor_count != act_gemv.H200_SMS:
        pytest.skip("the one-row launches are an H200's")
    x, w, _ = _case(4096, 14336, False, "cuda")
    out = act_gemv.silu_and_mul_linear(x, w)  # compiles outside the capture
    assert rel_err(out, reference(x, w)) < TOL[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = act_gemv.silu_and_mul_linear(x, w)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_err(out, reference(x, w)) < TOL[torch.bfloat16]
