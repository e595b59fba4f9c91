"""Comparison helpers of the Triton tests."""

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 (NaN counts as failure)."""
    o, r = out.double(), ref.double()
    if torch.isnan(o).any():
        return float("inf")
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


# bf16 holds ~3 significant digits: a single rounding of each output gives ~4e-3 relative error
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def assert_rounded_equal(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Bitwise equal on the GPU; under the interpreter, whose fp32 -> bf16 cast truncates instead of
    rounding to nearest even, within one bf16 ulp."""
    if interpreting() and got.dtype == torch.bfloat16:
        torch.testing.assert_close(got.float(), ref.float(), rtol=2.0**-7, atol=1e-30)
    else:
        assert torch.equal(got, ref)
