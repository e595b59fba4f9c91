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


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_linear_default_is_the_two_ops(residual, dtype):
    # norm/rms_linear composes rms_norm / fused_add_rms_norm and linear: the model's norm-then-project
    # path gives the numbers it gave as two calls
    from lightspeed_kernel.reference.norm import rms_norm_linear as reference

    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(3, 32, generator=g).to(dtype), torch.randn(3, 32, generator=g).to(dtype)
    nw, w, b = torch.rand(32, generator=g).to(dtype), torch.randn(8, 32, generator=g).to(dtype), torch.randn(8).to(dtype)
    out, h = ops.rms_norm_linear(x, r.clone() if residual else None, nw, 1e-6, w, b)
    if residual:
        normed, want_h = ops.fused_add_rms_norm(x, r.clone(), nw, 1e-6)
    else:
        normed, want_h = ops.rms_norm(x, nw, 1e-6), x
    assert torch.equal(out, ops.linear(normed, w, b)) and torch.equal(h, want_h)
    ref_out, ref_h = reference(x, r.clone() if residual else None, nw, 1e-6, w, b)
    assert torch.allclose(out.float(), ref_out.float(), rtol=2e-2, atol=2e-2) and torch.equal(h, ref_h)
