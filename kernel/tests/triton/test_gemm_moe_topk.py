import pytest
import torch
from lightspeed_kernel.reference import gemm as ref_gemm
from lightspeed_kernel.reference import moe as ref_moe
from lightspeed_kernel.reference import quantize as ref_q
from lightspeed_kernel.triton import fp8_gemm, moe_topk
from tk_helpers import rel_err


def _fp8_operands(m, n, k, device):
    a, a_s = ref_q.quant_fp8_per_block(torch.randn(m, k, device=device))
    w = torch.randn(n, k, device=device)
    nb, kb = -(-n // 128), -(-k // 128)
    wp = torch.zeros(nb * 128, kb * 128, device=device)
    wp[:n, :k] = w
    blocks = wp.view(nb, 128, kb, 128)
    b_s = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / 448.0
    b = (blocks / b_s[:, None, :, None]).view(nb * 128, kb * 128)[:n, :k].to(torch.float8_e4m3fn)
    return a, a_s, b.contiguous(), b_s


@pytest.mark.parametrize("m,n,k", [(0, 128, 128), (1, 128, 128), (5, 200, 384), (33, 64, 320)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_block_gemm(device, m, n, k, out_dtype):
    a, a_s, b, b_s = _fp8_operands(m, n, k, device)
    want = ref_gemm.fp8_block_gemm(a, a_s, b, b_s, out_dtype=out_dtype)
    got = fp8_gemm.fp8_block_gemm(a, a_s, b, b_s, out_dtype=out_dtype)
    assert got.shape == (m, n) and got.dtype == out_dtype
    if m:
        # Hopper's fp8 tensor cores accumulate each 128-deep dot with a reduced-precision (not full
        # fp32) accumulator: 1.2e-4 relative was measured on the H200 for an fp32 output
        assert rel_err(got, want) < (5e-4 if out_dtype == torch.float32 else 8e-3)


def _same_routing(got, want):
    (gw, gi), (ww, wi) = got, want
    assert gi.dtype == torch.int32 and gw.dtype == torch.float32 and gi.shape == wi.shape
    # the chosen set per token must agree; order within the top-k may differ only at exact ties
    gs, order = gi.long().sort(dim=1)
    ws, worder = wi.long().sort(dim=1)
    assert torch.equal(gs, ws)
    torch.testing.assert_close(gw.gather(1, order), ww.gather(1, worder), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("t,e,k", [(0, 8, 2), (1, 8, 1), (6, 60, 4), (3, 128, 8)])
def test_moe_topk(device, scoring, renormalize, t, e, k):
    # distinct logits (spaced wider than a bf16 ulp): which of two equal scores wins is unspecified
    logits = (torch.rand(t, e).argsort(dim=1).float() * (4.0 / e) - 2.0).to(torch.bfloat16)
    logits = logits.to(device)
    kw = {"scoring": scoring, "renormalize": renormalize, "routed_scaling_factor": 2.5}
    _same_routing(moe_topk.moe_topk(logits, k, **kw), ref_moe.moe_topk(logits, k, **kw))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("e,groups,kept,k", [(64, 8, 4, 6), (32, 4, 1, 2), (16, 16, 3, 3)])
def test_moe_grouped_topk(device, bias, e, groups, kept, k):
    logits = torch.randn(5, e, device=device)
    b = torch.randn(e, device=device) * 0.1 if bias else None
    kw = {"scoring": "sigmoid", "correction_bias": b, "num_groups": groups, "topk_groups": kept}
    _same_routing(moe_topk.moe_topk(logits, k, **kw), ref_moe.moe_topk(logits, k, **kw))


@pytest.mark.gpu
def test_fp8_gemm_and_topk_gpu_sizes():
    a, a_s, b, b_s = _fp8_operands(512, 7168, 2048, "cuda")
    assert rel_err(fp8_gemm.fp8_block_gemm(a, a_s, b, b_s), ref_gemm.fp8_block_gemm(a, a_s, b, b_s)) < 8e-3
    a, a_s, b, b_s = _fp8_operands(8, 4096, 7168, "cuda")
    assert rel_err(fp8_gemm.fp8_block_gemm(a, a_s, b, b_s), ref_gemm.fp8_block_gemm(a, a_s, b, b_s)) < 8e-3
    logits = torch.randn(4096, 256, device="cuda")
    bias = torch.randn(256, device="cuda") * 0.1
    kw = {
        "scoring": "sigmoid",
        "correction_bias": bias,
        "num_groups": 8,
        "topk_groups": 4,
        "routed_scaling_factor": 2.5,
    }
    _same_routing(moe_topk.moe_topk(logits, 8, **kw), ref_moe.moe_topk(logits, 8, **kw))
