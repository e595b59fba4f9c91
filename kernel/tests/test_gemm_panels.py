"""The panel path of the fused weight-only GEMM (cpu/csrc/quant_gemm.c, decode batches of
PANEL_MIN_ROWS..DENSE_MIN_ROWS-1 token rows): against a float64 evaluation of the same quantised
math, within a bound of fp32 accumulation order; every token count of the path (balanced tiles of
up to 6 rows), odd weight-row counts (a half-empty last panel), group sizes 16..128, x rows that
are not 32-byte aligned; and the portable build (no AVX2, no panel path) on the same inputs."""

import ctypes
import subprocess

import pytest
import torch

lk = pytest.importorskip("lightspeed_kernel")
from lightspeed_kernel import QuantizedWeight, ops  # noqa: E402
from lightspeed_kernel.cpu import NATIVE_AVAILABLE  # noqa: E402
from lightspeed_kernel.cpu.gemm import DENSE_MIN_ROWS, PANEL_MIN_ROWS  # noqa: E402

pytestmark = pytest.mark.skipif(not NATIVE_AVAILABLE, reason="no native CPU kernels on this machine")

FP32_EPS = 2.0**-24


def _float64(x: torch.Tensor, qw: QuantizedWeight, bias: torch.Tensor | None):
    """(exact result, the fp32 bound): w = scale * code + min per element in float64; the kernel
    rounds each weight once (an FMA) and each of K products and sums, so its error is below
    (K + 2) eps sum_k |w x| (plus the bias' rounding)."""
    k = qw.shape[1]
    groups = torch.arange(k) // qw.group_size
    w = qw.codes().double() * qw.scales.double()[:, groups] + qw.mins.double()[:, groups]
    exact = x.double() @ w.t() + (0 if bias is None else bias.double())
    bound = (k + 2) * FP32_EPS * (x.double().abs() @ w.abs().t()) + 1e-30
    if bias is not None:
        bound = bound + FP32_EPS * bias.double().abs()
    return exact, bound


def _assert_within(got, exact, bound, what):
    excess = ((got.double() - exact).abs() / bound).max().item() if got.numel() else 0.0
    assert excess <= 1.0, f"{what}: error {excess:.2f}x the fp32 accumulation bound"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k,group", [(1, 32, 32), (7, 64, 16), (33, 576, 32), (20, 384, 128), (5, 1536, 64)])
def test_panel_path_matches_float64(bits, n, k, group):
    gen = torch.Generator().manual_seed(bits * 1000 + n + k + group)
    qw = QuantizedWeight.quantize(torch.randn(n, k, generator=gen) * 0.05, bits, group)
    op = ops.linear_w4 if bits == 4 else ops.linear_w8
    for tokens in range(PANEL_MIN_ROWS - 1, DENSE_MIN_ROWS):  # one below the path, then all of it
        x = torch.randn(tokens, k, generator=gen)
        bias = torch.randn(n, generator=gen) if tokens % 2 else None
        with lk.override(**{f"gemm/w{bits}": f"native_w{bits}"}):
            got = op(x, qw.qweight, qw.scales, qw.mins, bias, group_size=group)
        _assert_within(got, *_float64(x, qw, bias), f"w{bits} {n}x{k} g{group} T={tokens}")


def test_unaligned_activation_rows():
    # x as a view 4 floats into its storage: every 32-byte load of x splits a cache line
    qw = QuantizedWeight.quantize(torch.randn(19, 320) * 0.05, 4, 32)
    base = torch.randn(16 * 320 + 4)
    x = base[4:].view(16, 320)
    assert x.data_ptr() % 32
    with lk.override(**{"gemm/w4": "native_w4"}):
        got = ops.linear_w4(x, qw.qweight, qw.scales, qw.mins, group_size=32)
    _assert_within(got, *_float64(x, qw, None), "unaligned x")


def test_portable_build_agrees(tmp_path):
    """quant_gemm.c built for plain x86-64 (or the generic target elsewhere): the portable loops,
    which never take the panel path, against the float64 math on the panel path's token counts."""
    import platform

    from lightspeed_kernel.cpu import native

    source = native.CSRC / "quant_gemm.c"
    march = "-march=x86-64" if platform.machine() in ("x86_64", "AMD64") else "-O2"
    lib_path = tmp_path / "portable.so"
    proc = subprocess.run([native.compiler(), "-O2", march, "-std=gnu11", "-fPIC", "-shared", "-o", str(lib_path),
                           str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(lib_path))
    fn = lib.ls_w4_linear
    fn.argtypes = native.SIGNATURES["ls_w4_linear"]
    fn.restype = ctypes.c_int
    qw = QuantizedWeight.quantize(torch.randn(13, 192) * 0.05, 4, 32)
    for tokens in (1, 9, 16):
        x = torch.randn(tokens, 192)
        out = torch.empty(tokens, 13)
        assert fn(x.data_ptr(), tokens, 192, qw.qweight.data_ptr(), qw.scales.data_ptr(), qw.mins.data_ptr(), 13, 32,
                  None, out.data_ptr(), PANEL_MIN_ROWS) == 0
        _assert_within(out, *_float64(x, qw, None), f"portable T={tokens}")
