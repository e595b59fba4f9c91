"""CPU kernels beyond the references, registered in the ``cpu`` capability.

- ``native_*`` (solution ``native``): C kernels from ``csrc/`` (weight-only w4 / w8 GEMV and GEMM,
  paged decode attention, RMSNorm, SiLU-and-mul, rotary, K/V store), built with the machine's C
  compiler the first time this package is imported with these sources (`native.py`; a few
  seconds, then cached). Registered only when that build succeeds: no compiler, a failing build
  (a warning says why, `NATIVE_ERROR` keeps it) or ``LIGHTSPEED_KERNEL_DISABLE_NATIVE=1`` leave
  the references in charge.
- ``sdpa_prefill`` (solution ``torch``): paged prefill through torch's fused CPU attention.
"""

from __future__ import annotations

import warnings

from . import native, sdpa  # noqa: F401  (sdpa registers on import)

NATIVE_ERROR: str | None = None
NATIVE_AVAILABLE = False
if native.available():
    try:
        native.library()
    except native.NativeBuildError as e:
        NATIVE_ERROR = str(e)
        warnings.warn(f"native CPU kernels unavailable: {e}", stacklevel=2)
    else:
        from . import attention, elementwise, gemm  # noqa: F401  (register on import)

        NATIVE_AVAILABLE = True

__all__ = ["NATIVE_AVAILABLE", "NATIVE_ERROR", "native"]
