"""Placements and the tensor-parallel context.

Design note: every parallel layer declares how its input and output are laid out across the
ranks of its group (`Replicate`, `Shard(dim)`, `Partial`). A layer never calls a collective
directly; it states the placement it produced and the one its consumer needs, and
`redistribute` inserts the collective that turns one into the other (all-reduce for
Partial → Replicate, all-gather for Shard → Replicate, a local slice for Replicate → Shard).
Tensor / expert parallelism is then a matter of which `ParallelContext` each layer receives
(attention TP, dense TP and MoE groups may differ), not a rewrite of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Replicate:
    """Every rank holds the full tensor."""


@dataclass(frozen=True)
class Shard:
    """Every rank holds one equal slice of the tensor along `dim`, in rank order."""

    dim: int


@dataclass(frozen=True)
class Partial:
    """Every rank holds a full-shape addend; the true tensor is the sum over ranks."""


Placement = Replicate | Shard | Partial


@dataclass(frozen=True)
class ParallelContext:
    """One tensor-parallel group: this process's rank in it, its size and the process group.

    `tp_size == 1` (the default) means no collectives at all. `group=None` with `tp_size > 1`
    uses torch.distributed's default (world) group.
    """

    tp_rank: int = 0
    tp_size: int = 1
    group: Any = None

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"invalid tensor-parallel rank {self.tp_rank} of size {self.tp_size}")

    def divide(self, total: int, what: str) -> int:
        """`total / tp_size`, raising a clear error when `total` does not split evenly."""
        if total % self.tp_size:
            raise ValueError(f"{what} = {total} is not divisible by tensor-parallel size {self.tp_size}")
        return total // self.tp_size


def _all_gather(x: torch.Tensor, dim: int, ctx: ParallelContext) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(ctx.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=ctx.group)
    return torch.cat(parts, dim=dim)


def redistribute(x: torch.Tensor, src: Placement, dst: Placement, ctx: ParallelContext) -> torch.Tensor:
    """Turn `x`, laid out as `src` over the ranks of `ctx`, into layout `dst`."""
    if ctx.tp_size == 1 or src == dst:
        return x
    if isinstance(dst, Replicate):
        if isinstance(src, Partial):
            x = x.contiguous()
            dist.all_reduce(x, group=ctx.group)
            return x
        if isinstance(src, Shard):
            return _all_gather(x, src.dim, ctx)
    if isinstance(dst, Shard):
        if isinstance(src, Partial):
            x = redistribute(x, src, Replicate(), ctx)
            src = Replicate()
        if isinstance(src, Replicate):
            return x.chunk(ctx.tp_size, dim=dst.dim)[ctx.tp_rank].contiguous()
    raise ValueError(f"no redistribution from {src} to {dst}")
