"""What the library-backed attention adapters (`flashinfer`, `sdpa`) share: the identity of the
step's metadata tensors (their per-step plans are cached by it) and the kernel a call they do not
take goes to."""

from __future__ import annotations

import importlib
import sys

import torch


def metadata_identity(t: torch.Tensor) -> tuple:
    """Address, dtype, shape, strides and torch's version counter. Inference tensors (all of the
    engine's step metadata) carry no version counter: their identity is their address, which stays
    theirs while the adapter holds the tensors it planned for."""
    return (t.data_ptr(), t.device, t.dtype, tuple(t.shape), t.stride(), -1 if t.is_inference() else t._version)


def next_attention_kernel(mode: str, q: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """attention/`mode` by the next kernel in line: Triton on a GPU where it loaded, else the reference."""
    triton = sys.modules.get(f"{__package__}.triton")
    if q.is_cuda and triton is not None and getattr(triton, "AVAILABLE", False):
        module = importlib.import_module(f"{__package__}.triton.attention_{mode}")
    else:
        module = importlib.import_module(f"{__package__}.reference.attention")
    return getattr(module, f"attention_{mode}")(q, *args, **kwargs)
