import pytest
import torch
from lightspeed_kernel import ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [0, 1, 13])
@pytest.mark.parametrize("bias", [False, True])
def test_linear(dtype, tokens, bias):
    x = torch.randn(tokens, 64, dtype=dtype)
    w = torch.randn(48, 64, dtype=dtype) / 8
    b = torch.randn(48, dtype=dtype) if bias else None
    expected = x.double() @ w.double().t() + (b.double() if bias else 0)
    got = ops.linear(x, w, b)
    assert got.shape == (tokens, 48) and got.dtype == dtype
    tol = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    torch.testing.assert_close(got.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("m,n,k", [(1, 128, 128), (5, 256, 384), (3, 200, 300), (0, 128, 128)])
def test_fp8_block_gemm_matches_blockwise_sum(m, n, k):
    torch.manual_seed(m * n + k)
    a = (torch.randn(m, k) * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k) * 2).to(torch.float8_e4m3fn)
    kb, nb = -(-k // 128), -(-n // 128)
    a_scale = torch.rand(m, kb) + 0.1
    b_scale = torch.rand(nb, kb) + 0.1
    # independent: sum over K blocks of scale_a[m, kb] * scale_b[n/128, kb] * (a_blk @ b_blk^T)
    expected = torch.zeros(m, n, dtype=torch.float64)
    for j in range(kb):
        cols = slice(j * 128, (j + 1) * 128)
        partial = a[:, cols].double() @ b[:, cols].double().t()  # [m, n]
        b_s = b_scale[:, j].double().repeat_interleave(128)[:n]
        expected += partial * a_scale[:, j].double()[:, None] * b_s[None, :]
    got = ops.fp8_block_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-3)
    assert ops.fp8_block_gemm(a, a_scale, b, b_scale).dtype == torch.bfloat16


def test_fp8_block_gemm_with_quantized_inputs_approximates_bf16():
    torch.manual_seed(0)
    x, w = torch.randn(4, 256), torch.randn(256, 256) / 16
    qa, sa = ops.quant_fp8_per_block(x)
    qw, sw_rows = ops.quant_fp8_per_block(w)
    # per-128x128 weight scales from the per-row-block ones: take the block max
    sw = sw_rows.view(2, 128, 2).amax(dim=1)
    qw = (w / sw.repeat_interleave(128, 0).repeat_interleave(128, 1)).to(torch.float8_e4m3fn)
    got = ops.fp8_block_gemm(qa, sa, qw, sw, out_dtype=torch.float32)
    rel = (got - x @ w.t()).norm() / (x @ w.t()).norm()
    assert rel < 0.05
