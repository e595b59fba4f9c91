"""The int8-activation GEMM (cpu/csrc/q8_gemm.c): both of its paths (AVX2 where the CPU has it, the
portable loops always) against a float64 evaluation of the same quantised math, which is exact up
to fp32 accumulation order; awkward shapes (K not a multiple of the 256-column superblock, odd
weight-row counts, token rows 1, 2, 17, 64); the env switches; and the precision it costs against
fp32 activations."""

import pytest
import torch

lk = pytest.importorskip("lightspeed_kernel")
from lightspeed_kernel import QuantizedWeight, ops  # noqa: E402
from lightspeed_kernel.cpu import NATIVE_AVAILABLE  # noqa: E402

pytestmark = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="no native CPU kernels on this machine")

SUPERBLOCK = 256


def _q8_reference(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """float64 of the kernel's math: activations in int8 per 256-column superblock (fp32 scale
    max|x| / 127, round to nearest even), weight scales as int16 times one fp32 scale per
    superblock, the mins term on the quantised activations too."""
    t, k = x.shape
    superblock = torch.arange(k) // SUPERBLOCK
    nsb = int(superblock.max()) + 1
    x = x.float()
    dx = torch.stack([x[:, superblock == s].abs().amax(1) for s in range(nsb)], 1) / 127.0
    inv = torch.where(dx != 0, 1.0 / dx, torch.zeros_like(dx))
    xq = torch.round(x * inv[:, superblock])  # fp32 product, then ties to even: as the kernel
    kw_max = 4095.0 if qw.bits == 8 else 16383.0
    scale = qw.scales.float()[:, torch.arange(k) // qw.group_size]
    dw = torch.stack([scale[:, superblock == s].abs().amax(1) for s in range(nsb)], 1) / kw_max
    kw = torch.where(dw[:, superblock] != 0, torch.round(scale / dw[:, superblock]), torch.zeros_like(scale))
    w = qw.codes().double() * kw.double() * dw.double()[:, superblock]
    xd = xq.double() * dx.double()[:, superblock]
    sums = xd.reshape(t, k // qw.group_size, qw.group_size).sum(-1)
    return xd @ w.t() + sums @ qw.mins.double().t()


def _run(bits, x, qw, bias=None, force_scalar=False):
    from lightspeed_kernel.cpu import gemm

    out = torch.empty(x.shape[0], qw.shape[0])
    rc = gemm.linear_q8_into(bits, x.contiguous(), qw.qweight, qw.scales, qw.mins, bias, qw.group_size, out,
                             force_scalar)
    assert rc == 0
    return out


def _assert_fp32_close(got, want, what):
    # fp32 sums of up to K products: bound the error by the output's scale, not each element (w4
    # outputs cancel a large codes term against a large mins term)
    err = (got.double() - want).abs().max() / want.pow(2).mean().sqrt().clamp_min(1e-30)
    assert err < 2e-5, f"{what}: max error {err:.2e} of the rms output"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [16, 32, 64])
@pytest.mark.parametrize("n,k", [(1, 64), (7, 192), (33, 576), (6, 320)])
def test_both_paths_match_the_float64_quantised_math(bits, group, n, k):
    gen = torch.Generator().manual_seed(bits * 1000 + group + n + k)
    qw = QuantizedWeight.quantize(torch.randn(n, k, generator=gen) * 0.05, bits, group)
    for tokens in (1, 2, 17, 64):
        x = torch.randn(tokens, k, generator=gen) * torch.rand(1, k, generator=gen) * 4  # uneven columns
        bias = torch.randn(n, generator=gen) if tokens % 2 else None
        want = _q8_reference(x, qw) + (0 if bias is None else bias.double())
        for scalar in (False, True):
            _assert_fp32_close(_run(bits, x, qw, bias, scalar), want, f"w{bits} g{group} {n}x{k} T={tokens} "
                               f"scalar={scalar}")


def test_extreme_codes_zero_rows_and_zero_scales():
    k = 288  # one full superblock and a 32-column tail
    gen = torch.Generator().manual_seed(3)
    qw = QuantizedWeight.quantize(torch.randn(5, k, generator=gen), 8, 32)
    qw.qweight[0] = -128  # |w| = 128 must read as an unsigned byte in the sign trick
    qw.qweight[1] = 127
    qw.scales[2] = 0.0  # a weight row whose scales are all zero
    qw.scales[3, :8] = 0.0  # a superblock of zero scales beside non-zero ones
    x = torch.randn(3, k, generator=gen)
    x[1] = 0.0  # an activation row of zeros: scale 0, codes 0
    x[2, :256] = 0.0
    x[0, 5] = -1e4  # an outlier
    for scalar in (False, True):
        got = _run(8, x, qw, force_scalar=scalar)
        _assert_fp32_close(got, _q8_reference(x, qw), f"scalar={scalar}")
        assert torch.all(got[1] == 0) and torch.all(got[:, 2] == 0)


def test_int8_activations_cost_little_precision():
    # against fp32 activations on the same weights: the error int8 activations add, stated
    gen = torch.Generator().manual_seed(5)
    qw = QuantizedWeight.quantize(torch.randn(64, 576, generator=gen) * 0.05, 4, 32)
    x = torch.randn(16, 576, generator=gen)
    exact = x.double() @ qw.dequantize().double().t()
    rel = (_run(4, x, qw).double() - exact).norm() / exact.norm()
    assert 0 < rel < 1e-2  # measured 0.7% here (1.7% with the mins term on x itself)


def test_the_w4_op_quantises_activations_from_two_rows_when_switched_on(monkeypatch):
    from lightspeed_kernel.cpu import gemm

    gen = torch.Generator().manual_seed(7)
    qw = QuantizedWeight.quantize(torch.randn(40, 320, generator=gen) * 0.05, 4, 32)
    x = torch.randn(5, 320, generator=gen)

    def op(rows):
        return ops.linear_w4(x[:rows], qw.qweight, qw.scales, qw.mins, group_size=32)

    fp32 = x.double() @ qw.dequantize().double().t()
    assert gemm.DENSE_MIN_ROWS > 5
    torch.testing.assert_close(op(5).double(), fp32, rtol=1e-4, atol=1e-4)  # default: fp32 activations
    monkeypatch.setenv("LIGHTSPEED_KERNEL_Q8_ACTIVATIONS", "1")
    lk.refresh()
    try:
        _assert_fp32_close(op(5), _q8_reference(x, qw), "T=5")
        torch.testing.assert_close(op(1).double(), fp32[:1], rtol=1e-4, atol=1e-4)  # one row: fp32 activations
    finally:
        monkeypatch.delenv("LIGHTSPEED_KERNEL_Q8_ACTIVATIONS")
        lk.refresh()


def test_the_scalar_switch_reaches_the_op(monkeypatch):
    gen = torch.Generator().manual_seed(9)
    qw = QuantizedWeight.quantize(torch.randn(9, 576, generator=gen) * 0.05, 4, 16)
    x = torch.randn(17, 576, generator=gen)
    monkeypatch.setenv("LIGHTSPEED_KERNEL_NATIVE_SCALAR", "1")
    monkeypatch.setenv("LIGHTSPEED_KERNEL_Q8_ACTIVATIONS", "1")
    lk.refresh()
    try:
        assert lk.kernel_env().native_scalar
        got = ops.linear_w4(x, qw.qweight, qw.scales, qw.mins, group_size=16)
    finally:
        monkeypatch.delenv("LIGHTSPEED_KERNEL_NATIVE_SCALAR")
        monkeypatch.delenv("LIGHTSPEED_KERNEL_Q8_ACTIVATIONS")
        lk.refresh()
    assert torch.equal(got, _run(4, x, qw, force_scalar=True))


def test_integer_scales_follow_in_place_weight_changes():
    gen = torch.Generator().manual_seed(11)
    qw = QuantizedWeight.quantize(torch.randn(4, 64, generator=gen), 4, 32)
    x = torch.randn(3, 64, generator=gen)
    _run(4, x, qw)
    qw.scales.mul_(2.0)  # a reload in place: the cached integer scales must not be reused
    _assert_fp32_close(_run(4, x, qw), _q8_reference(x, qw), "after scales changed")
