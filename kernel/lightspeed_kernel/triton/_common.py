"""Helpers shared by the Triton launchers: interpreter detection, checks, registration.

The registry lands in `lightspeed_kernel.registry`; registration goes through `register()` here so
that every Triton kernel declares the same solution, priority band and capability, and so that this
package still imports (with no candidates) if the registry is absent.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl

from ..env import kernel_env

FP8_E4M3_MAX = 448.0


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1 (CPU tensors, numpy semantics); from the kernel package's
    environment snapshot, not os.environ: this runs on every kernel launch."""
    return kernel_env().triton_interpret


def dot_upcast() -> bool:
    """The Triton 3.x interpreter computes bf16 `tl.dot` wrongly; kernels upcast operands to fp32
    there (a constexpr, so compiled GPU code keeps native-dtype tensor-core dots)."""
    return interpreting()


def dot_precision(dtype: torch.dtype) -> str:
    """`input_precision` of tl.dot for operands of `dtype`: fp32 inputs get full IEEE fp32 products
    (torch's default fp32 matmul; tf32 measured 2.7e-3 relative error in fused MoE on the H200)."""
    return "ieee" if dtype == torch.float32 else "tf32"


# -- programmatic dependent launch (PDL) -----------------------------------------------------------
# A batch-1 decode step is ~350 short kernels replayed from one CUDA graph; without PDL each waits for
# the one before it to drain before it is even scheduled (~0.6 us a boundary on the H200: 4.82 ms of
# wall against 4.60 ms of kernel time, bench/results/h200_gemv_one_row_2026-12-03_1506/). Under PDL
# the next kernel's programs are launched while this one runs and wait in `pdl_enter` for its writes.


@functools.cache
def _pdl_capable(device_index: int) -> bool:
    """An NVIDIA sm_90+ GPU and a Triton whose CUDA launcher takes `launch_pdl` (3.4 and later)."""
    if torch.version.hip is not None or not hasattr(tl.extra.cuda, "gdc_wait"):
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    if "launch_pdl" not in {f.name for f in dataclasses.fields(CUDAOptions)}:
        return False
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_args(device: torch.device) -> dict:
    """Launch arguments of a kernel that starts with `pdl_enter(USE_PDL)`: `USE_PDL` and, where the
    GPU and Triton support it and LIGHTSPEED_KERNEL_PDL is not 0, `launch_pdl=True`."""
    env = kernel_env()
    if not env.pdl or env.triton_interpret or device.type != "cuda":
        return {"USE_PDL": False}
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"USE_PDL": True, "launch_pdl": True} if _pdl_capable(index) else {"USE_PDL": False}


@triton.jit
def pdl_enter(USE_PDL: tl.constexpr):
    """The first statement of a PDL kernel, before any load or store: wait until the kernel before it
    has finished and its writes are visible, then let the kernel after it be scheduled (which in turn
    waits here for this one). Both instructions are no-ops when the launch was not a PDL one."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_dtype(name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    check(t.dtype in allowed, f"{name}: dtype {t.dtype} not in {list(allowed)}")


def check_last_contiguous(name: str, t: torch.Tensor) -> None:
    check(t.dim() == 0 or t.stride(-1) == 1 or t.numel() == 0, f"{name}: last dim must be contiguous")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {n: t.device for n, t in tensors.items() if t is not None}
    check(len(set(devices.values())) <= 1, f"tensors on different devices: {devices}")


def scale_tensor(scale, device: torch.device) -> torch.Tensor | None:
    """k_scale/v_scale may be a float or a 1-element tensor; kernels read it through a pointer so a
    tensor scale never forces a host sync (CUDA-graph safe)."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        check(scale.numel() == 1, "scale tensor must hold one element")
        return scale.reshape(1).to(device=device, dtype=torch.float32)
    return torch.full((1,), float(scale), dtype=torch.float32, device=device)


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8_DTYPES = tuple(
    d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d is not None
)


def register(
    family: str,
    mode: str,
    name: str,
    dtypes: Sequence[torch.dtype],
    *,
    min_cc: tuple[int, int] | None = (8, 0),
    features: Sequence[str] = (),
    traits: dict | None = None,
) -> Callable:
    """Register `fn` as the PERFORMANT Triton candidate for family/mode on CUDA devices."""

    def deco(fn: Callable) -> Callable:
        try:
            from lightspeed_kernel.registry import register_kernel
        except ImportError:  # registry not importable: nothing to register with
            return fn
        return register_kernel(
            family,
            mode,
            name=name,
            solution="triton",
            priority=_performant(),
            capability=_cuda_capability(min_cc),
            dtypes=tuple(dtypes),
            features=tuple(features),
            traits=dict(traits or {}),
            tags=("triton",),
        )(fn)

    return deco


def _performant():
    from lightspeed_kernel.registry import Priority

    return Priority.PERFORMANT


def _cuda_capability(min_cc):
    return {"device_types": ("cuda",), "min_compute_capability": min_cc}
