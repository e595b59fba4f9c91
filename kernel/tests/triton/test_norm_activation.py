import pytest
import torch
from lightspeed_kernel.reference import activation as ref_act
from lightspeed_kernel.reference import norm as ref_norm
from lightspeed_kernel.triton import activation, norm
from tk_helpers import TOL, assert_rounded_equal, rel_err

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h", [(0, 64), (1, 1), (3, 100), (5, 256)])
def test_rms_norm(device, dtype, t, h):
    x = torch.randn(t, h, device=device).to(dtype)
    w = torch.randn(h, device=device).to(dtype)
    ref = ref_norm.rms_norm(x, w, 1e-6)
    out = torch.full_like(x, float("nan"))
    got = norm.rms_norm(x, w, 1e-6, out=out)
    assert got is out and got.shape == (t, h)
    if t:
        assert rel_err(got, ref) < TOL[dtype]


def test_rms_norm_strided_rows(device):
    base = torch.randn(4, 96, device=device)
    x = base[:, :64]  # row stride 96
    w = torch.rand(64, device=device)
    assert rel_err(norm.rms_norm(x, w, 1e-5), ref_norm.rms_norm(x, w, 1e-5)) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,h", [(0, 32), (1, 7), (4, 192)])
def test_fused_add_rms_norm(device, dtype, t, h):
    x = torch.randn(t, h, device=device).to(dtype)
    res = torch.randn(t, h, device=device).to(dtype)
    w = torch.randn(h, device=device).to(dtype)
    ref_out, ref_res = ref_norm.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-6)
    out, new_res = norm.fused_add_rms_norm(x, res, w, 1e-6)
    assert new_res.data_ptr() == res.data_ptr()
    if t:
        assert_rounded_equal(new_res, ref_res)  # one rounding of the fp32 sum, both sides
        assert rel_err(out, ref_out) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t,inter", [(0, 8), (1, 1), (3, 37), (2, 300)])
@pytest.mark.parametrize("kind", ["silu", "gelu", "gelu_tanh"])
def test_act_and_mul(device, dtype, t, inter, kind):
    x = (2 * torch.randn(t, 2 * inter, device=device)).to(dtype)
    if kind == "silu":
        ref, got = ref_act.silu_and_mul(x), activation.silu_and_mul(x)
    else:
        approx = "tanh" if kind == "gelu_tanh" else "none"
        ref, got = ref_act.gelu_and_mul(x, approx), activation.gelu_and_mul(x, approx)
    assert got.shape == (t, inter) and got.dtype == dtype
    if t:
        assert rel_err(got, ref) < TOL[dtype]


def test_gelu_rejects_unknown_approximation(device):
    with pytest.raises(ValueError):
        activation.gelu_and_mul(torch.randn(2, 8, device=device), "sigmoid")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norm_activation_gpu_sizes(dtype):
    x = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=dtype)
    assert rel_err(norm.rms_norm(x, w, 1e-6), ref_norm.rms_norm(x, w, 1e-6)) < TOL[dtype]
    ref_out, ref_res = ref_norm.fused_add_rms_norm(x.clone(), res.clone(), w, 1e-6)
    out, new_res = norm.fused_add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(new_res, ref_res) and rel_err(out, ref_out) < TOL[dtype]
    g = torch.randn(512, 2 * 14336, device="cuda", dtype=dtype)
    assert rel_err(activation.silu_and_mul(g), ref_act.silu_and_mul(g)) < TOL[dtype]
    assert rel_err(activation.gelu_and_mul(g, "tanh"), ref_act.gelu_and_mul(g, "tanh")) < TOL[dtype]
