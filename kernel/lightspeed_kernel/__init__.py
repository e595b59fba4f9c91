"""lightspeed-kernel: the kernel registry and the op families of Lightspeed.

``from lightspeed_kernel import ops`` for the ops; the registry API is re-exported here. The
torch references and the CPU kernels (``lightspeed_kernel.cpu``) register on import; the Triton
kernels (``lightspeed_kernel.triton``) register when Triton is importable; entry-point plugins load
at the first selection. `QuantizedWeight` is the weight-only w4 / w8 format the gemm ops read.
"""

from __future__ import annotations

import warnings

from . import cpu, reference  # noqa: F401  (register the torch references and the CPU kernels)
from .env import KernelEnv, kernel_env
from .quantized_weight import CopyRecord, QuantizedWeight
from .registry import (
    ANY,
    CPU,
    ENTRY_POINT_GROUP,
    REGISTRY,
    Candidate,
    Capability,
    Explanation,
    KernelRegistry,
    KernelSelectionError,
    KernelSpec,
    Platform,
    PluginStatus,
    Priority,
    SelectedKernel,
    current_platform,
    explain,
    list_kernels,
    override,
    platform_of,
    refresh,
    register_kernel,
    select_kernel,
)

__version__ = "0.1.0"


def _import_triton_kernels() -> bool:
    """Import the built-in Triton kernels if possible; absent Triton means fewer candidates."""
    if kernel_env().disable_triton:
        return False
    try:
        from . import triton  # noqa: F401
    except ImportError as e:
        if e.name and e.name.split(".")[0] not in ("triton", "lightspeed_kernel"):
            warnings.warn(f"lightspeed_kernel.triton not loaded: {e}", stacklevel=2)
        return False
    except Exception as e:  # noqa: BLE001 - a broken optional backend must not break the package
        warnings.warn(f"lightspeed_kernel.triton failed to import: {type(e).__name__}: {e}", stacklevel=2)
        return False
    return True


TRITON_AVAILABLE = _import_triton_kernels()

# After every built-in backend registered; deepgemm registers DeepGEMM's fp8 GEMM when `deep_gemm` imports,
# flashinfer FlashInfer's paged attention when `flashinfer` is installed (imported at its first call),
# sdpa a paged prefill through torch's own fused attention (opt-in until measured);
# composed: fused op families' defaults, made of the ops they fuse.
from . import composed, deepgemm, flashinfer, ops, sdpa  # noqa: E402, F401

__all__ = [
    "ANY",
    "CPU",
    "ENTRY_POINT_GROUP",
    "REGISTRY",
    "TRITON_AVAILABLE",
    "Candidate",
    "Capability",
    "CopyRecord",
    "Explanation",
    "KernelEnv",
    "KernelRegistry",
    "KernelSelectionError",
    "KernelSpec",
    "Platform",
    "PluginStatus",
    "Priority",
    "QuantizedWeight",
    "SelectedKernel",
    "__version__",
    "current_platform",
    "explain",
    "kernel_env",
    "list_kernels",
    "ops",
    "override",
    "platform_of",
    "refresh",
    "register_kernel",
    "select_kernel",
]
