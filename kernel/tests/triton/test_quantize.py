import pytest
import torch
from lightspeed_kernel.reference import quantize as ref_q
from lightspeed_kernel.triton import quantize
from tk_helpers import assert_fp8_codes_match

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _assert_same(got, ref):
    (q, s), (rq, rs) = got, ref
    assert q.shape == rq.shape and q.dtype == torch.float8_e4m3fn
    assert s.shape == rs.shape and s.dtype == torch.float32
    torch.testing.assert_close(s, rs, rtol=1e-6, atol=0)
    assert_fp8_codes_match(q, rq)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h", [(0, 128), (1, 1), (3, 200), (4, 256)])
def test_per_token(device, dtype, t, h):
    x = (3 * torch.randn(t, h, device=device)).to(dtype)
    _assert_same(quantize.quant_fp8_per_token(x), ref_q.quant_fp8_per_token(x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h,block", [(0, 256, 128), (1, 128, 128), (3, 384, 128), (2, 200, 64)])
def test_per_block(device, dtype, t, h, block):
    x = torch.randn(t, h, device=device).to(dtype)
    x[:, :block] *= 100  # groups with very different ranges
    _assert_same(quantize.quant_fp8_per_block(x, block), ref_q.quant_fp8_per_block(x, block))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,hh,d", [(0, 2, 64), (1, 1, 16), (3, 4, 64)])
def test_per_token_head(device, dtype, t, hh, d):
    x = torch.randn(t, hh, d, device=device).to(dtype)
    _assert_same(quantize.quant_fp8_per_token_head(x), ref_q.quant_fp8_per_token_head(x))


def test_zero_group_gets_finite_scale(device):
    x = torch.zeros(2, 128, device=device)
    q, s = quantize.quant_fp8_per_token(x)
    assert torch.isfinite(s).all() and (s > 0).all() and (q.float() == 0).all()


@pytest.mark.gpu
def test_quantize_gpu_sizes():
    x = torch.randn(4096, 7168, device="cuda", dtype=torch.bfloat16)
    _assert_same(quantize.quant_fp8_per_token(x), ref_q.quant_fp8_per_token(x))
    _assert_same(quantize.quant_fp8_per_block(x), ref_q.quant_fp8_per_block(x))
    y = x.view(4096, 56, 128)
    _assert_same(quantize.quant_fp8_per_token_head(y), ref_q.quant_fp8_per_token_head(y))
