import math

import pytest
import torch
from lightspeed_kernel import ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _gelu_erf(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inter", [(0, 8), (1, 1), (5, 96), (17, 1536)])
def test_silu_and_mul(dtype, tokens, inter):
    x = torch.randn(tokens, 2 * inter, dtype=dtype) * 4
    gate, up = x.double()[:, :inter], x.double()[:, inter:]
    expected = gate / (1 + torch.exp(-gate)) * up
    got = ops.silu_and_mul(x)
    assert got.shape == (tokens, inter) and got.dtype == dtype
    torch.testing.assert_close(got.double(), expected, rtol=TOL[dtype], atol=TOL[dtype])
    out = torch.empty(tokens, inter, dtype=dtype)
    assert ops.silu_and_mul(x, out=out) is out and torch.equal(out, got)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate,fn", [("none", _gelu_erf), ("tanh", _gelu_tanh)])
def test_gelu_and_mul(dtype, approximate, fn):
    x = torch.randn(6, 2 * 40, dtype=dtype) * 3
    expected = fn(x.double()[:, :40]) * x.double()[:, 40:]
    got = ops.gelu_and_mul(x, approximate)
    torch.testing.assert_close(got.double(), expected, rtol=TOL[dtype], atol=TOL[dtype])
    out = torch.empty(6, 40, dtype=dtype)
    assert ops.gelu_and_mul(x, approximate, out=out) is out and torch.equal(out, got)
    with pytest.raises(ValueError):
        ops.gelu_and_mul(x, "fast")
