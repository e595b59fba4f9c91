"""memory/host_copy: bytes between the GPU and pinned host memory, moved by the SMs (see ops/memory.py).

Pinned host memory (cudaHostAlloc, what torch's `pin_memory` uses) has one address for the host and every
device under unified addressing, so a kernel loads or stores it directly over PCIe. Each program moves one
block of 32-bit words (bytes when the size or an address is not a multiple of 4): a step's inputs or results
are a few KB, one or a few programs, a launch of a few microseconds that no other stream's copies can delay.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check, register

BLOCK = 4096


# Nothing specialised (pointer alignment, size): one build per word width serves every call, so no JIT mid-serve.
@triton.jit(do_not_specialize=["src_ptr", "dst_ptr", "n"])
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


@register("memory", "host_copy", "triton_host_copy", (torch.uint8,))
def host_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    check(src.dtype == dst.dtype == torch.uint8 and src.numel() == dst.numel(),
          "triton_host_copy takes two uint8 tensors of one size (ops.host_copy passes their bytes)")
    n = src.numel()
    if n % 4 == 0 and src.data_ptr() % 4 == 0 and dst.data_ptr() % 4 == 0:
        src, dst, n = src.view(torch.int32), dst.view(torch.int32), n // 4
    _copy_kernel[(triton.cdiv(n, BLOCK),)](src, dst, n, BLOCK=BLOCK, num_warps=4)
