"""Triton kernels of every op family, registered at PERFORMANT priority on CUDA (except gemv.py's
skinny bf16 GEMM: PORTABLE, below cuBLAS, opt-in until measured on the H200).

Importing this package never fails: without Triton (or when a Triton module cannot be built on
this install) `AVAILABLE` is False, `IMPORT_ERROR` says why, and the registry just has fewer
candidates. On a CPU machine the kernels run only under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import importlib

MODULES = (
    "norm",
    "activation",
    "rope",
    "kv_store",
    "quantize",
    "attention_decode",
    "attention_prefill",
    "fp8_gemm",
    "gemv",
    "norm_gemv",
    "act_gemv",
    "moe_topk",
    "fused_moe",
    "fused_moe_fp8",
    "sampling",
    "spec",
    "memory",
)

AVAILABLE = False
IMPORT_ERROR: str | None = None

try:
    import triton  # noqa: F401
    import triton.language  # noqa: F401
except Exception as e:  # ImportError, or a broken install raising at import
    IMPORT_ERROR = f"triton unavailable: {type(e).__name__}: {e}"
else:
    for _name in MODULES:  # each module registers its kernels on import
        importlib.import_module(f"{__name__}.{_name}")
    AVAILABLE = True

__all__ = ["AVAILABLE", "IMPORT_ERROR", "MODULES"]
