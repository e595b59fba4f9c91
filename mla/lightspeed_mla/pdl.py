"""Programmatic dependent launch (PDL) for this package's decode path, decided as the kernel package decides it
for its own decode-path kernels (`lightspeed_kernel/triton/_common.py`: LIGHTSPEED_KERNEL_PDL, default on, an
NVIDIA sm_90+ GPU and a Triton that launches with `launch_pdl`). Under PDL a kernel's CTAs are scheduled while
the kernel before it still runs and wait for its writes before their first global read, which hides the
launch and ramp at each boundary (sm90's decode then its combine, the combine then the next layer's kernels).

Looked up at launch time, not import time: this package imports without the kernel registry.
"""

from __future__ import annotations

import torch


def pdl_launch_args(device: torch.device) -> dict:
    """Keyword arguments of a Triton kernel that starts with `pdl_enter(USE_PDL)`: {"USE_PDL": False}, or
    {"USE_PDL": True, "launch_pdl": True} where PDL is on."""
    try:
        from lightspeed_kernel.triton._common import pdl_args
    except ImportError:  # no Triton: nothing to launch with it
        return {"USE_PDL": False}
    return pdl_args(device)


def pdl_enabled(device: torch.device) -> bool:
    """Whether this package's CUDA and Triton decode kernels launch with PDL on `device`."""
    return bool(pdl_launch_args(device)["USE_PDL"])
