"""Every environment variable the kernel package reads, read once into one typed snapshot.

Call :func:`lightspeed_kernel.refresh` after changing the environment at run time (tests do).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field

OVERRIDE_PREFIX = "LIGHTSPEED_KERNEL_OVERRIDE_"


def override_env_name(family: str, mode: str) -> str:
    """``attention``, ``decode`` -> ``LIGHTSPEED_KERNEL_OVERRIDE_ATTENTION_DECODE``."""
    return OVERRIDE_PREFIX + re.sub(r"[^0-9A-Za-z]", "_", f"{family}_{mode}").upper()


@dataclass(frozen=True)
class KernelEnv:
    """Snapshot of the ``LIGHTSPEED_KERNEL_*`` variables."""

    config_path: str | None = None
    """LIGHTSPEED_KERNEL_CONFIG: a TOML file with an ``[overrides]`` table."""
    overrides: dict[str, str] = field(default_factory=dict)
    """LIGHTSPEED_KERNEL_OVERRIDE_<FAMILY>_<MODE>=<kernel name>, keyed by variable name."""
    disable_plugins: bool = False
    """LIGHTSPEED_KERNEL_DISABLE_PLUGINS=1: do not load entry-point plugins."""
    disable_triton: bool = False
    """LIGHTSPEED_KERNEL_DISABLE_TRITON=1: do not import the built-in Triton kernels."""
    triton_interpret: bool = False
    """TRITON_INTERPRET (Triton's own variable, read when kernels are decorated): kernels run in
    Triton's CPU interpreter, and launch paths pick interpreter-safe options."""
    disable_native: bool = False
    """LIGHTSPEED_KERNEL_DISABLE_NATIVE=1: do not register the C kernels of lightspeed_kernel.cpu."""
    native_scalar: bool = False
    """LIGHTSPEED_KERNEL_NATIVE_SCALAR=1: the int8-activation GEMM runs its portable C loops even
    where the CPU has AVX2 (to test or compare the fallback)."""
    q8_activations: bool = False
    """LIGHTSPEED_KERNEL_Q8_ACTIVATIONS=1: decode batches (2 to 23 token rows) of 4-bit weights
    quantise their activations to int8 and run integer dots (cpu/csrc/q8_gemm.c). Off by default:
    on a Zen 3 without VNNI it measured no faster than fp32 activations at 8 to 16 rows."""
    decode_small_grid: bool = True
    """LIGHTSPEED_KERNEL_DECODE_SMALL_GRID=0: paged decode plans one or two requests (<= 16 request x
    kv-head programs) like larger batches (block_n 64, three waves of splits), not with the H200
    sweep's small-grid winners (block_n 32, six waves); for A/B runs."""
    pdl: bool = True
    """LIGHTSPEED_KERNEL_PDL=0: launch the decode-path Triton kernels (skinny GEMM, paged decode,
    norms, RoPE + KV store, gated activation) without programmatic dependent launch on sm_90+, so
    each waits for the kernel before it to finish before it is even scheduled; for A/B runs."""
    native_cc: str | None = None
    """LIGHTSPEED_KERNEL_CC (else CC): the C compiler that builds the native CPU kernels."""
    native_cache_dir: str | None = None
    """LIGHTSPEED_KERNEL_CACHE_DIR: where built native kernels are kept (default
    $XDG_CACHE_HOME or ~/.cache, under lightspeed/kernels)."""


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def kernel_env() -> KernelEnv:
    """The environment snapshot (read on first use)."""
    environ = os.environ
    return KernelEnv(
        config_path=environ.get("LIGHTSPEED_KERNEL_CONFIG") or None,
        overrides={k: v.strip() for k, v in environ.items() if k.startswith(OVERRIDE_PREFIX) and v.strip()},
        disable_plugins=_flag(environ.get("LIGHTSPEED_KERNEL_DISABLE_PLUGINS")),
        disable_triton=_flag(environ.get("LIGHTSPEED_KERNEL_DISABLE_TRITON")),
        triton_interpret=environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        disable_native=_flag(environ.get("LIGHTSPEED_KERNEL_DISABLE_NATIVE")),
        native_scalar=_flag(environ.get("LIGHTSPEED_KERNEL_NATIVE_SCALAR")),
        q8_activations=_flag(environ.get("LIGHTSPEED_KERNEL_Q8_ACTIVATIONS")),
        decode_small_grid=environ.get("LIGHTSPEED_KERNEL_DECODE_SMALL_GRID", "1").strip() not in ("0", "false", "no", "off"),
        pdl=environ.get("LIGHTSPEED_KERNEL_PDL", "1").strip() not in ("0", "false", "no", "off"),
        native_cc=environ.get("LIGHTSPEED_KERNEL_CC") or environ.get("CC") or None,
        native_cache_dir=environ.get("LIGHTSPEED_KERNEL_CACHE_DIR")
        or os.path.join(environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lightspeed", "kernels"),
    )
