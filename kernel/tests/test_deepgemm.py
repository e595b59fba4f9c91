"""DeepGEMM backend: import-guarded (absent here: nothing registers), and the adapter over a stand-in
library registers below Triton, runs only when asked for, and hands unsupported shapes on."""

from types import SimpleNamespace

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import deepgemm
from lightspeed_kernel.reference import gemm as ref_gemm
from lightspeed_kernel.reference import quantize as ref_q


def test_absent_library_registers_nothing():
    pytest.importorskip("triton")  # the CPU test image: no deep_gemm
    try:
        import deep_gemm  # noqa: F401
    except ImportError:
        assert not deepgemm.AVAILABLE and "deep_gemm" in deepgemm.IMPORT_ERROR
        assert deepgemm.KERNEL_NAME not in {s.name for s in lk.list_kernels("gemm")}


def _operands(m, n, k):
    a, a_s = ref_q.quant_fp8_per_block(torch.randn(m, k))
    b = torch.randn(n, k).to(torch.float8_e4m3fn)
    return a, a_s, b, torch.rand(-(-n // 128), -(-k // 128)) + 0.5


@pytest.mark.parametrize("api", ["fp8_gemm_nt", "gemm_fp8_fp8_bf16_nt"])
def test_adapter_over_a_stand_in_library(registry_sandbox, api):
    calls = []

    def gemm(lhs, rhs, out):  # what DeepGEMM computes, in the reference's math
        calls.append(api)
        out.copy_(ref_gemm.fp8_block_gemm(lhs[0], lhs[1], rhs[0], rhs[1]))

    lib = SimpleNamespace(**{api: gemm, "get_col_major_tma_aligned_tensor": lambda t: t})
    deepgemm.register(*deepgemm.gemm_entry(lib), registry=registry_sandbox)
    hopper = lk.Platform.parse("sm_90")
    chosen = lk.select_kernel("gemm", "fp8_block", torch.float8_e4m3fn, platform=hopper)
    assert chosen.name != deepgemm.KERNEL_NAME  # unverified on hardware: below Triton until measured
    forced = lk.select_kernel("gemm", "fp8_block", torch.float8_e4m3fn, platform=hopper,
                              override=deepgemm.KERNEL_NAME)
    a, a_s, b, b_s = _operands(5, 256, 256)
    torch.testing.assert_close(forced.impl(a, a_s, b, b_s), ref_gemm.fp8_block_gemm(a, a_s, b, b_s))
    assert calls == [api]
    a, a_s, b, b_s = _operands(3, 128, 200)  # K not a multiple of 128: handed on, not to DeepGEMM
    out = forced.impl(a, a_s, b, b_s, out_dtype=torch.float32)
    torch.testing.assert_close(out, ref_gemm.fp8_block_gemm(a, a_s, b, b_s, out_dtype=torch.float32))
    assert calls == [api]


def test_unknown_api_is_an_import_error():
    with pytest.raises(ImportError, match="neither"):
        deepgemm.gemm_entry(SimpleNamespace())
