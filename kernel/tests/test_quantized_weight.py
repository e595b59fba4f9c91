"""The w4 / w8 weight format: packing order, quantisers, views and copies (lightspeed_kernel.QuantizedWeight)."""

import pytest
import torch
from lightspeed_kernel import QuantizedWeight
from lightspeed_kernel.quantized_weight import pack_w4, unpack_w4


def test_w4_block_order_is_ggufs():
    # byte j of a 32-column block: column j in the low nibble, column j + 16 in the high one
    codes = torch.randint(0, 16, (3, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    packed = pack_w4(codes)
    assert packed.shape == (3, 32) and packed.dtype == torch.uint8
    for block in range(2):
        for j in range(16):
            byte = packed[:, block * 16 + j]
            assert torch.equal(byte & 15, codes[:, block * 32 + j])
            assert torch.equal(byte >> 4, codes[:, block * 32 + 16 + j])
    assert torch.equal(unpack_w4(packed), codes)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [16, 32, 128])
def test_quantize_error_is_half_a_step_per_element(bits, group):
    w = torch.randn(24, 256, generator=torch.Generator().manual_seed(bits + group)) * 0.1
    qw = QuantizedWeight.quantize(w, bits, group)
    assert qw.shape == (24, 256) and qw.format == f"w{bits}/g{group}"
    step = qw.scales.repeat_interleave(group, dim=1)
    assert ((qw.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    if bits == 8:
        assert torch.count_nonzero(qw.mins) == 0  # symmetric, as Q8_0


def test_dequantize_is_the_formula():
    codes = torch.randint(0, 16, (5, 64), generator=torch.Generator().manual_seed(1))
    scales, mins = torch.rand(5, 2), torch.randn(5, 2)
    qw = QuantizedWeight.from_codes(codes, scales, mins, 4, 32)
    expected = torch.empty(5, 64)
    for n in range(5):
        for k in range(64):
            expected[n, k] = scales[n, k // 32] * codes[n, k] + mins[n, k // 32]
    torch.testing.assert_close(qw.dequantize(), expected)
    rows = torch.tensor([4, 0, 4])
    torch.testing.assert_close(qw.dequantize()[rows], qw.index_rows(rows).dequantize())


def test_constant_and_zero_groups_quantise_without_nan():
    w = torch.zeros(2, 32)
    w[1] = 3.0
    for bits in (4, 8):
        torch.testing.assert_close(QuantizedWeight.quantize(w, bits).dequantize(), w)


@pytest.mark.parametrize("bad", [
    dict(bits=3, group=32), dict(bits=4, group=24), dict(bits=4, group=8), dict(bits=8, group=64, k=96),
])
def test_bad_formats_are_rejected(bad):
    with pytest.raises(ValueError):
        QuantizedWeight.empty(4, bad.get("k", 64), bad["bits"], bad["group"])


def test_codes_out_of_range_are_rejected():
    with pytest.raises(ValueError, match="0..15"):
        QuantizedWeight.from_codes(torch.full((1, 32), 16), torch.ones(1, 1), None, 4, 32)


def test_row_views_write_through_and_log_their_rows():
    w = torch.randn(6, 64)
    dst = QuantizedWeight.empty(6, 64, 4, 32)
    dst.narrow(0, 0, 2).copy_(QuantizedWeight.quantize(w[:2], 4, 32))
    dst.narrow(0, 2, 4).copy_(w[2:])
    torch.testing.assert_close(dst.dequantize(), QuantizedWeight.quantize(w, 4, 32).dequantize())
    first, second = dst.copy_log
    assert (first.row_start, first.rows, first.exact, first.source) == (0, 2, True, "w4/g32")
    assert (second.row_start, second.rows, second.exact, second.source) == (2, 4, False, "float")
    assert 0 < second.rel_error < 0.2


def test_column_views_need_whole_groups():
    dst = QuantizedWeight.empty(2, 128, 8, 64)
    dst.narrow(1, 64, 64).copy_(torch.ones(2, 64))
    assert torch.count_nonzero(dst.dequantize()[:, :64]) == 0
    torch.testing.assert_close(dst.dequantize()[:, 64:], torch.ones(2, 64))
    with pytest.raises(ValueError, match="multiples of 64"):
        dst.narrow(1, 32, 32)


def test_exact_copies_widen_codes_and_split_groups():
    src = QuantizedWeight.quantize(torch.randn(3, 128), 4, 64)
    for bits, group in ((4, 64), (4, 32), (8, 64), (8, 16)):
        dst = QuantizedWeight.empty(3, 128, bits, group).copy_(src)
        assert dst.copy_log[-1].exact and dst.copy_log[-1].rel_error == 0.0
        torch.testing.assert_close(dst.dequantize(), src.dequantize(), rtol=0, atol=0)


def test_narrower_targets_are_requantised_with_the_error_measured():
    src = QuantizedWeight.quantize(torch.randn(4, 64), 8, 32)
    dst = QuantizedWeight.empty(4, 64, 4, 32).copy_(src)
    record = dst.copy_log[-1]
    expected = (dst.dequantize() - src.dequantize()).norm() / src.dequantize().norm()
    assert not record.exact and record.source == "w8/g32"
    assert record.rel_error == pytest.approx(float(expected), rel=1e-5)


def test_copy_checks_shape_and_finiteness():
    dst = QuantizedWeight.empty(2, 32, 4)
    with pytest.raises(ValueError, match="cannot copy"):
        dst.copy_(torch.zeros(3, 32))
    with pytest.raises(ValueError, match="non-finite"):
        dst.copy_(torch.full((2, 32), float("nan")))
