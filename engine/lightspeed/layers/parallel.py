"""Placements, tensor-parallel contexts and the layout of a model over its process groups.

Design note: every parallel layer declares how its input and output are laid out across the
ranks of its group (`Replicate`, `Shard(dim)`, `Partial`). A leaf layer states the placement it
produces and `redistribute` inserts the collective that turns one placement into another
(all-reduce for Partial → Replicate, reduce-scatter for Partial → Shard(0), all-gather for
Shard → Replicate, a local slice for Replicate → Shard). Which collective sits at each residual
boundary of a decoder layer is decided once, by the placement compiler (`placement.py`), from the
blocks' annotations. Tensor / expert parallelism is then a matter of which `ParallelContext` each
part of a layer receives (`ParallelLayout`: attention TP, dense TP and MoE groups may differ),
not a rewrite of the model.
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
    """Every rank holds one slice of the tensor along `dim`, in rank order. Token shards
    (`Shard(0)`) are equal after padding the tokens to a multiple of the group size; feature shards
    may be uneven (`ParallelContext.split`) where nothing ever gathers them."""

    dim: int


@dataclass(frozen=True)
class Partial:
    """Every rank holds a full-shape addend; the true tensor is the sum over ranks."""


Placement = Replicate | Shard | Partial


def split_sizes(total: int, parts: int) -> list[int]:
    """`total` units over `parts` ranks as evenly as possible, the larger shares first."""
    base, extra = divmod(total, parts)
    return [base + (r < extra) for r in range(parts)]


@dataclass(frozen=True)
class ParallelContext:
    """One process group: this process's rank in it, its size and the torch.distributed group.

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

    def split(self, total: int, unit: int = 1) -> tuple[int, int]:
        """This rank's `(start, size)` of `total` items split unevenly in whole `unit`s (e.g. the
        query heads of whole KV-head groups): the first `(total / unit) % tp_size` ranks get one
        unit more. Raises when `total` is not a whole number of units or a rank would get none."""
        if total % unit:
            raise ValueError(f"{total} is not a whole number of {unit}-sized units")
        sizes = split_sizes(total // unit, self.tp_size)
        if sizes[-1] == 0:
            raise ValueError(f"{total // unit} units cannot be split over {self.tp_size} ranks")
        start = sum(sizes[: self.tp_rank])
        return start * unit, sizes[self.tp_rank] * unit


@dataclass(frozen=True)
class ParallelLayout:
    """How a decoder model is laid out over its process groups (DESIGN §6: three groups).

    - `attention`: heads, the vocabulary (embedding, LM head) and the residual stream;
    - `dense`: the intermediate dimension of dense MLPs (the attention group, or trivial: replicated);
    - `moe`: the experts. With `expert_parallel` every rank of the group holds `E / size` whole
      experts, otherwise a slice of every expert's intermediate dimension (tensor parallel).
      It is the attention group, or a larger group of several data-parallel attention groups
      (expert parallel only: tokens then travel by all-to-all).
    - `sequence_parallel`: the residual stream between blocks is sharded by tokens over the
      attention group (reduce-scatter + all-gather around the norms instead of all-reduce).
    """

    attention: ParallelContext = ParallelContext()
    dense: ParallelContext = ParallelContext()
    moe: ParallelContext = ParallelContext()
    expert_parallel: bool = False
    sequence_parallel: bool = False

    @classmethod
    def of(cls, parallel: ParallelContext | ParallelLayout | None) -> ParallelLayout:
        """A layout from a single context (every group the same tensor-parallel group)."""
        if isinstance(parallel, ParallelLayout):
            return parallel
        ctx = parallel or ParallelContext()
        return cls(ctx, ctx, ctx)

    @property
    def moe_tokens_sharded(self) -> bool:
        """True when MoE layers receive distinct tokens on every rank of their group (Shard(0)) and
        exchange them by all-to-all: expert parallelism over a group wider than the attention
        group (data-parallel attention), or within it under sequence parallelism."""
        return self.expert_parallel and self.moe.tp_size > 1 and (
            self.sequence_parallel or self.moe.tp_size > self.attention.tp_size)


# torch >= 2.11 renamed the single-tensor collectives (the old names warn); older torch has only those.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _all_gather(x: torch.Tensor, dim: int, ctx: ParallelContext) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(ctx.tp_size)]
    dist.all_gather(parts, x.contiguous(), group=ctx.group)
    return torch.cat(parts, dim=dim)


def all_gather_rows(x: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """`[C, ...]` on every rank -> `[n·C, ...]` in rank order (Shard(0) → Replicate)."""
    out = x.new_empty((ctx.tp_size * x.shape[0], *x.shape[1:]))
    _all_gather_single(out, x.contiguous(), group=ctx.group)
    return out


def reduce_scatter_rows(x: torch.Tensor, ctx: ParallelContext) -> torch.Tensor:
    """Partial `[n·C, ...]` -> this rank's `[C, ...]` of the sum (Partial → Shard(0))."""
    if x.shape[0] % ctx.tp_size:
        raise ValueError(f"reduce-scatter of {x.shape[0]} rows over {ctx.tp_size} ranks: pad the rows first")
    out = x.new_empty((x.shape[0] // ctx.tp_size, *x.shape[1:]))
    _reduce_scatter_single(out, x.contiguous(), group=ctx.group)
    return out


def redistribute(x: torch.Tensor, src: Placement, dst: Placement, ctx: ParallelContext) -> torch.Tensor:
    """Turn `x`, laid out as `src` over the ranks of `ctx`, into layout `dst`. Token shards
    (`Shard(0)`) need a row count divisible by the group size (see `placement.TokenShards`)."""
    if ctx.tp_size == 1 or src == dst:
        return x
    if isinstance(dst, Replicate):
        if isinstance(src, Partial):
            x = x.contiguous()
            dist.all_reduce(x, group=ctx.group)
            return x
        if isinstance(src, Shard):
            return all_gather_rows(x, ctx) if src.dim == 0 else _all_gather(x, src.dim, ctx)
    if isinstance(dst, Shard):
        if isinstance(src, Partial):
            if dst.dim == 0:
                return reduce_scatter_rows(x, ctx)
            x = redistribute(x, src, Replicate(), ctx)
            src = Replicate()
        if isinstance(src, Replicate):
            return x.chunk(ctx.tp_size, dim=dst.dim)[ctx.tp_rank].contiguous()
    raise ValueError(f"no redistribution from {src} to {dst}")
