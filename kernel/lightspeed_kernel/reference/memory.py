"""Reference for memory/host_copy: torch's copy (the copy engine on a GPU)."""

from __future__ import annotations

import torch

from ._register import reference


@reference("memory", "host_copy")
def host_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst.copy_(src, non_blocking=dst.is_pinned() or src.is_pinned())
