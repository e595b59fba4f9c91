import pytest
import torch
from lightspeed_kernel import ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _naive_rms(x, w, eps):
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(0, 64), (1, 8), (7, 576), (33, 1024)])
def test_rms_norm(dtype, tokens, hidden):
    torch.manual_seed(tokens + hidden)
    x = torch.randn(tokens, hidden, dtype=dtype) * 3
    w = torch.randn(hidden, dtype=dtype)
    got = ops.rms_norm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), _naive_rms(x, w, 1e-6), rtol=TOL[dtype], atol=TOL[dtype])
    out = torch.empty_like(x)
    assert ops.rms_norm(x, w, 1e-6, out=out) is out
    assert torch.equal(out, got)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [0, 1, 9])
def test_fused_add_rms_norm(dtype, tokens):
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 128, dtype=dtype)
    residual = torch.randn(tokens, 128, dtype=dtype)
    w = torch.rand(128, dtype=dtype) + 0.5
    expected_residual = (x.double() + residual.double()).to(dtype)
    normed, new_residual = ops.fused_add_rms_norm(x, residual.clone(), w, 1e-5)
    torch.testing.assert_close(new_residual, expected_residual, rtol=0, atol=0)
    torch.testing.assert_close(
        normed.double(), _naive_rms(expected_residual, w, 1e-5), rtol=TOL[dtype], atol=TOL[dtype]
    )
    # same numbers as an unfused add + rms_norm
    assert torch.equal(normed, ops.rms_norm(expected_residual, w, 1e-5))


def test_rms_norm_zero_row_is_finite():
    got = ops.rms_norm(torch.zeros(2, 16), torch.ones(16), 1e-6)
    assert torch.equal(got, torch.zeros(2, 16))
