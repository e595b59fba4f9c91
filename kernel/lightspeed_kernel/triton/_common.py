"""Helpers shared by the Triton launchers: interpreter detection, checks, registration.

The registry lands in `lightspeed_kernel.registry`; registration goes through `register()` here so
that every Triton kernel declares the same solution, priority band and capability, and so that this
package still imports (with no candidates) if the registry is absent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton

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
