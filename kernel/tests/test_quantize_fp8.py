"""FP8 quantisation (ops/quantize.py; named apart from tests/triton/test_quantize.py)."""

import pytest
import torch
from lightspeed_kernel import ops

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _check_group(x, q, scale):
    # x, q: [..., G]; scale: [..., 1]: amax maps to 448, the dequantised value is within e4m3 rounding
    x = x.double()
    amax = x.abs().amax(-1, keepdim=True)
    torch.testing.assert_close(scale.double(), (amax / 448).clamp(min=1e-10 / 448), rtol=1e-6, atol=0)
    deq = q.double() * scale.double()
    assert ((deq - x).abs() <= x.abs() * 2**-3 + scale.double() * 2**-6 + 1e-12).all()
    assert (q.double().abs() <= 448).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [0, 1, 7])
def test_per_token(dtype, tokens):
    x = torch.randn(tokens, 256, dtype=dtype) * 10
    q, scale = ops.quant_fp8_per_token(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == (tokens, 1)
    _check_group(x, q, scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [128, 512, 200])
def test_per_block(dtype, hidden):
    x = torch.randn(5, hidden, dtype=dtype) * torch.logspace(-2, 2, hidden).to(dtype)
    q, scale = ops.quant_fp8_per_block(x)
    blocks = -(-hidden // 128)
    assert scale.shape == (5, blocks) and q.shape == x.shape
    for b in range(blocks):
        cols = slice(b * 128, (b + 1) * 128)
        _check_group(x[:, cols], q[:, cols], scale[:, b : b + 1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_token_head(dtype):
    x = torch.randn(3, 4, 64, dtype=dtype)
    x[1, 2] = 0  # an all-zero head keeps a finite scale and zero codes
    q, scale = ops.quant_fp8_per_token_head(x)
    assert scale.shape == (3, 4) and q.shape == x.shape
    _check_group(x, q, scale[..., None])
    assert torch.isfinite(scale).all() and q[1, 2].float().eq(0).all()
