"""Weight-only quantised GEMM (gemm/w4, gemm/w8) and dequantisation: every implementation that runs
here against float64 matmuls of the dequantised weights, over token counts that cross the fused
kernel's tiles (1..5) and its switch to dequantise + GEMM (DENSE_MIN_ROWS)."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import QuantizedWeight, ops

MODES = ("w4", "w8", "w4_dequant", "w8_dequant")


def _impls(mode):
    return [spec for spec in lk.list_kernels("gemm", mode) if spec.capability.reject_reason(lk.CPU) is None]


def test_the_cpu_has_a_native_kernel_when_a_compiler_exists():
    from lightspeed_kernel.cpu import native

    names = {spec.name for mode in MODES for spec in _impls(mode)}
    assert {"reference"} <= names
    if native.available():
        assert {"native_w4", "native_w8", "native_w4_dequant", "native_w8_dequant"} <= names
        assert lk.select_kernel("gemm", "w4", "float32", platform=lk.CPU).name == "native_w4"


def _naive(x, qw, bias):
    # per-element formula in float64, independent of every kernel
    n, k = qw.shape
    codes = qw.codes().double()
    groups = torch.arange(k) // qw.group_size
    w = codes * qw.scales.double()[:, groups] + qw.mins.double()[:, groups]
    return x.double() @ w.t() + (0 if bias is None else bias.double())


def _int8_activations(kernel: str, bits: int, tokens: int) -> bool:
    # the native kernel quantises activations to int8 for decode batches of 4-bit weights
    from lightspeed_kernel.cpu import gemm

    return (kernel.startswith("native") and bits in gemm.Q8_BITS and lk.kernel_env().q8_activations
            and gemm.Q8_MIN_ROWS <= tokens < gemm.DENSE_MIN_ROWS)


INT8_REL_ERROR = 3e-2  # bound on tiny random shapes (one output of 32 products); about 0.7% at K=576


TOKENS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 23, 24, 40]
SHAPES = [(1, 32), (7, 64), (96, 128), (33, 576)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group", [16, 32, 64])
def test_linear_matches_float64(bits, n, k, group):
    if k % group:
        pytest.skip("group does not divide K")
    gen = torch.Generator().manual_seed(bits * n + k + group)
    qw = QuantizedWeight.quantize(torch.randn(n, k, generator=gen) * 0.05, bits, group)
    op = ops.linear_w4 if bits == 4 else ops.linear_w8
    for spec in _impls(f"w{bits}"):
        for tokens in TOKENS:
            x = torch.randn(tokens, k, generator=gen)
            bias = torch.randn(n, generator=gen) if tokens % 2 else None
            with lk.override(**{f"gemm/w{bits}": spec.name}):
                got = op(x, qw.qweight, qw.scales, qw.mins, bias, group_size=group)
            assert got.shape == (tokens, n) and got.dtype == torch.float32
            want = _naive(x, qw, bias)
            if _int8_activations(spec.name, bits, tokens):  # exact math checked in test_gemm_q8.py
                assert (got.double() - want).norm() <= INT8_REL_ERROR * want.norm(), f"{spec.name} T={tokens}"
                continue
            torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, s=spec.name, t=tokens: f"{s} T={t}: {m}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_activations_round_once(dtype):
    qw = QuantizedWeight.quantize(torch.randn(48, 64) * 0.1, 4, 32)
    for tokens in (1, 3, 30):
        x = torch.randn(tokens, 64).to(dtype)
        got = ops.linear(x, qw)
        assert got.dtype == dtype
        want = _naive(x, qw, None)
        if _int8_activations(lk.select_kernel("gemm", "w4", "float32", platform=lk.CPU).name, 4, tokens):
            assert (got.double() - want).norm() <= INT8_REL_ERROR * want.norm()
        else:
            torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=1e-2)


def test_dense_path_in_chunks(monkeypatch):
    from lightspeed_kernel.cpu import gemm, native

    if not native.available():
        pytest.skip("no native kernels on this machine")
    monkeypatch.setattr(gemm, "CHUNK_ELEMENTS", 5 * 64)  # 5 rows per chunk, a ragged last one
    qw = QuantizedWeight.quantize(torch.randn(23, 64), 8, 32)
    x, bias = torch.randn(30, 64), torch.randn(23)
    torch.testing.assert_close(ops.linear(x, qw, bias).double(), _naive(x, qw, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tokens,max_elements", [(40, 23 * 64), (40, 23 * 64 - 1), (39, 23 * 64)])
def test_dense_path_whole_weight_or_chunks(monkeypatch, tokens, max_elements):
    # From WHOLE_WEIGHT_ROWS rows a weight that fits WHOLE_WEIGHT_ELEMENTS is dequantised at once; one
    # element too big, or one row too few, and it goes in chunks: the same product every way.
    from lightspeed_kernel.cpu import gemm, native

    if not native.available():
        pytest.skip("no native kernels on this machine")
    monkeypatch.setattr(gemm, "DENSE_MIN_ROWS", 32)
    monkeypatch.setattr(gemm, "CHUNK_ELEMENTS", 5 * 64)
    monkeypatch.setattr(gemm, "WHOLE_WEIGHT_ROWS", 40)
    monkeypatch.setattr(gemm, "WHOLE_WEIGHT_ELEMENTS", max_elements)
    dequantised = []
    real = gemm._dequant_rows
    monkeypatch.setattr(gemm, "_dequant_rows", lambda *a, **kw: dequantised.append(a[6]) or real(*a, **kw))
    qw = QuantizedWeight.quantize(torch.randn(23, 64), 4, 32)
    x, bias = torch.randn(tokens, 64), torch.randn(23)
    torch.testing.assert_close(ops.linear(x, qw, bias).double(), _naive(x, qw, bias), rtol=1e-4, atol=1e-4)
    whole = tokens >= 40 and max_elements >= 23 * 64
    assert dequantised == ([23] if whole else [5, 5, 5, 5, 3])


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_rows_and_embedding(bits):
    qw = QuantizedWeight.quantize(torch.randn(40, 96), bits, 32)
    dense = _naive(torch.eye(96), qw, None).t().float()  # [40, 96]
    ids = torch.tensor([39, 0, 7, 7])
    for spec in _impls(f"w{bits}_dequant"):
        with lk.override(**{f"gemm/w{bits}_dequant": spec.name}):
            torch.testing.assert_close(ops.dequantize(qw), dense, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ops.dequantize(qw, ids), dense[ids], rtol=1e-6, atol=1e-6)
            assert ops.dequantize(qw, torch.zeros(0, dtype=torch.int64)).shape == (0, 96)
    qw.dtype = torch.bfloat16
    looked_up = ops.embedding(ids, qw)
    assert looked_up.dtype == torch.bfloat16 and looked_up.shape == (4, 96)
    torch.testing.assert_close(ops.embedding(ids, dense), dense[ids])


def test_bad_inputs_are_clear_errors():
    qw = QuantizedWeight.quantize(torch.randn(8, 64), 4, 32)
    with pytest.raises(ValueError):
        ops.linear_w4(torch.randn(2, 32), qw.qweight, qw.scales, qw.mins, group_size=32)  # K mismatch
    with pytest.raises(ValueError):
        ops.linear_w4(torch.randn(2, 64), qw.qweight, qw.scales.double(), qw.mins, group_size=32)
    with pytest.raises(ValueError):
        ops.linear_w4(torch.randn(2, 64), qw.qweight, qw.scales, qw.mins, torch.zeros(3), group_size=32)
    with pytest.raises(IndexError):
        ops.dequantize(qw, torch.tensor([8]))
