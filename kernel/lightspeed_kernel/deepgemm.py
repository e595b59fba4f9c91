"""DeepGEMM (`sgl-deep-gemm`, DeepSeek's FP8 GEMM library) as a `gemm/fp8_block` backend.

Import-guarded: without `deep_gemm` (any machine without CUDA, or where it does not install)
nothing registers and nothing fails. PyPI's `deep-gemm` is a broken source copy; `sgl-deep-gemm`
is its maintained packaging, and its API changed names over releases (`fp8_gemm_nt` now,
`gemm_fp8_fp8_bf16_nt` before), both handled here.

Unverified on hardware (not installable on the machines this was written on), so it registers in
the PORTABLE band, BELOW the Triton kernel: it runs only when asked for
(`LIGHTSPEED_KERNEL_OVERRIDE_GEMM_FP8_BLOCK=deepgemm_fp8_block_gemm`, or `lk.override`). Once it
measures faster on the H200, raise its priority to SPECIALIZED. Shapes DeepGEMM does not take
(K not a multiple of 128, a non-bf16 output) go to the next kernel in line.
"""

from __future__ import annotations

import importlib

import torch

from .registry import Priority, register_kernel

BLOCK = 128
KERNEL_NAME = "deepgemm_fp8_block_gemm"


def gemm_entry(lib):
    """(call(a, a_scale, b, b_scale, out), api name) for the installed DeepGEMM version."""
    if hasattr(lib, "fp8_gemm_nt"):  # current API: scales in the reference layout, transformed inside
        return (lambda a, a_s, b, b_s, out: lib.fp8_gemm_nt((a, a_s), (b, b_s), out)), "fp8_gemm_nt"
    if hasattr(lib, "gemm_fp8_fp8_bf16_nt"):  # older API: A's scales column-major and TMA-aligned
        def call(a, a_s, b, b_s, out):
            lib.gemm_fp8_fp8_bf16_nt((a, lib.get_col_major_tma_aligned_tensor(a_s)), (b, b_s), out)
        return call, "gemm_fp8_fp8_bf16_nt"
    raise ImportError("deep_gemm has neither fp8_gemm_nt nor gemm_fp8_fp8_bf16_nt")


def _fallback(a, a_scale, b, b_scale, out_dtype):
    """Shapes DeepGEMM does not take: the Triton kernel on a GPU where it imports, else the reference."""
    from .reference.gemm import fp8_block_gemm

    if a.is_cuda:
        try:
            from .triton.fp8_gemm import fp8_block_gemm
        except ImportError:
            pass
    return fp8_block_gemm(a, a_scale, b, b_scale, out_dtype=out_dtype)


def register(call, api: str, registry=None) -> None:
    """Register `call` (from :func:`gemm_entry`) as `gemm/fp8_block` kernel `deepgemm_fp8_block_gemm`."""

    @register_kernel("gemm", "fp8_block", name=KERNEL_NAME, solution="deepgemm", priority=Priority.PORTABLE,
                     capability={"vendors": ("nvidia",), "min_compute_capability": (9, 0)},
                     dtypes=(torch.float8_e4m3fn,), tags=("deepgemm", api), registry=registry)
    def deepgemm_fp8_block_gemm(a, a_scale, b, b_scale, *, out_dtype=torch.bfloat16):
        """a: [M, K] e4m3 with a_scale [M, K/128] fp32; b: [N, K] e4m3 with b_scale [N/128, K/128] -> [M, N]."""
        m, k = a.shape
        if out_dtype != torch.bfloat16 or k % BLOCK or m == 0:
            return _fallback(a, a_scale, b, b_scale, out_dtype)
        out = torch.empty((m, b.shape[0]), dtype=torch.bfloat16, device=a.device)
        call(a.contiguous(), a_scale.float().contiguous(), b, b_scale.float().contiguous(), out)
        return out


try:
    _CALL, _API = gemm_entry(importlib.import_module("deep_gemm"))
except Exception as e:  # noqa: BLE001 - ImportError, or a broken install raising at import
    AVAILABLE, IMPORT_ERROR = False, f"deep_gemm unavailable: {type(e).__name__}: {e}"
else:
    register(_CALL, _API)
    AVAILABLE, IMPORT_ERROR = True, None

__all__ = ["AVAILABLE", "IMPORT_ERROR", "KERNEL_NAME", "gemm_entry", "register"]
