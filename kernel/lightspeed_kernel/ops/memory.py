"""Transfers between the GPU and pinned host memory (family ``memory``). Dispatch: the GPU side's bytes."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def host_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst <- src, ordered on the current stream like a kernel (memory/host_copy).

    One side is on the GPU and the other in pinned host memory (or both on the CPU): same dtype, same number of
    elements, both contiguous. The Triton kernel moves the bytes with the SMs through the host pages, which a
    pinned allocation maps into the GPU's address space, instead of with the copy engine. A copy engine runs its
    copies in the order they were queued, whatever their stream: a step's token copy queued behind the KV host
    tier's write-through waited milliseconds for it (bench/results/profile_gpu_2026-12-07_1427_h100/). This
    transfer waits for nothing but the kernels before it on its stream. Meant for small transfers (a step's
    inputs and results: kilobytes); the copy engine stays the right tool for megabytes of KV pages.
    """
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise ValueError(f"host_copy: src {src.dtype} [{src.numel()}] and dst {dst.dtype} [{dst.numel()}] differ")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("host_copy: src and dst must be contiguous")
    if src.numel() == 0:
        return  # nothing to move; an empty pinned tensor has no storage, so is_pinned() says False
    host = dst if src.is_cuda and not dst.is_cuda else src if dst.is_cuda and not src.is_cuda else None
    if host is not None and not host.is_pinned():
        raise ValueError("host_copy: the host side must be pinned memory (pin_memory=True): the GPU cannot address "
                         "pageable memory")
    src_bytes, dst_bytes = as_bytes(src), as_bytes(dst)
    on_gpu = src_bytes if src_bytes.device.type != "cpu" else dst_bytes
    impl_for("memory", "host_copy", on_gpu)(src_bytes, dst_bytes)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, flat uint8 (bool and every width view as bytes)."""
    return t.reshape(-1).view(torch.uint8)
