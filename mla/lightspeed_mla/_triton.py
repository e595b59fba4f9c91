"""Import guard for Triton: absent (a CPU machine without it), the Triton paths are simply unavailable."""

import functools
import os

try:  # pragma: no cover - depends on the environment
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover
    triton = None
    tl = None
    HAS_TRITON = False


def require_triton() -> None:
    """Raise a clear error when a Triton kernel is asked for without Triton installed."""
    if not HAS_TRITON:
        raise RuntimeError("lightspeed_mla: this op needs Triton (pip install 'lightspeed-mla[triton]')")


@functools.cache
def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1). Read once: Triton
    reads it when kernels are decorated, and this runs on every launch. (Not the kernel package's
    env snapshot: this package imports without the registry.)"""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


__all__ = ["HAS_TRITON", "interpreting", "require_triton", "tl", "triton"]
