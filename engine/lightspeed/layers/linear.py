"""Linear layers with tensor-parallel placements.

Weights are stored `[out_features_per_rank, in_features_per_rank]` (the HF layout) and every
parameter carries a `weight_loader(param, loaded_weight, shard_id=None)` that copies this rank's
slice of a full checkpoint tensor into it. Fused layers (`qkv_proj`, `gate_up_proj`) take one
checkpoint tensor per `shard_id`.

How a layer multiplies by its weight is its `scheme` (a strategy object, not a branch): the
default `UNQUANTIZED` calls `ops.linear`; `layers.quantization` swaps in FP8 block-scaled weights.
The loaders take `block`: a parameter whose rows (and columns) count weight blocks of that size,
such as FP8 block scales, is sliced in block units.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lightspeed_kernel import ops
from torch import nn

from .parallel import ParallelContext, Partial, Placement, Replicate, Shard, redistribute


def _copy_checked(param: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"{what}: checkpoint shape {tuple(loaded.shape)} != parameter shape {tuple(param.shape)}")
    param.data.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Copy a replicated tensor whole."""
    _copy_checked(param, loaded, "replicated weight")


def _in_blocks(rows: int, block: int, what: str) -> int:
    if rows % block:
        raise ValueError(f"{what}: {rows} rows are not a whole number of {block}-row weight blocks")
    return rows // block


class UnquantizedScheme:
    """The default scheme: `y = x W^T + b` on the full-precision weight."""

    @staticmethod
    def apply(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return ops.linear(x, layer.weight, bias)


UNQUANTIZED = UnquantizedScheme()


class _LinearBase(nn.Module):
    """Holds `weight [out_local, in_local]` and an optional `bias [out_local]`."""

    input_placement: Placement = Replicate()
    output_placement: Placement = Replicate()
    scheme = UNQUANTIZED  # how the weight is stored and multiplied (layers.quantization replaces it)

    def __init__(self, in_local: int, out_local: int, bias: bool, parallel: ParallelContext):
        super().__init__()
        self.parallel = parallel
        self.weight = nn.Parameter(torch.empty(out_local, in_local), requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(out_local), requires_grad=False)
            self.bias.weight_loader = self.weight_loader
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None, block: int = 1) -> None:
        raise NotImplementedError

    def extra_repr(self) -> str:
        out_f, in_f = self.weight.shape
        return f"in={in_f}, out={out_f}, bias={self.bias is not None}, tp={self.parallel.tp_size}"


class ReplicatedLinear(_LinearBase):
    """`y = x W^T + b` with the full weight on every rank. Replicate → Replicate."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 parallel: ParallelContext | None = None):
        super().__init__(in_features, out_features, bias, parallel or ParallelContext())

    def weight_loader(self, param, loaded, shard_id=None, block=1):
        _copy_checked(param, loaded, "ReplicatedLinear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in] -> [T, out]
        return self.scheme.apply(self, x, self.bias)


class ColumnParallelLinear(_LinearBase):
    """Output features split over ranks. Replicate → Shard(-1), or Replicate with `gather_output`."""

    input_placement = Replicate()

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 parallel: ParallelContext | None = None, gather_output: bool = False,
                 out_local: int | None = None):
        parallel = parallel or ParallelContext()
        if out_local is None:
            out_local = parallel.divide(out_features, "output features")
        super().__init__(in_features, out_local, bias, parallel)
        self.gather_output = gather_output
        self.output_placement = Replicate() if gather_output else Shard(-1)

    def weight_loader(self, param, loaded, shard_id=None, block=1):
        size = param.shape[0]  # rows of this rank: weight rows, or blocks of them for block scales
        _copy_checked(param, loaded.narrow(0, self.parallel.tp_rank * size, size), "ColumnParallelLinear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in] -> [T, out / tp]
        y = self.scheme.apply(self, x, self.bias)
        return redistribute(y, Shard(-1), self.output_placement, self.parallel)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one GEMM (e.g. gate ‖ up).

    Each rank holds its slice of every output, concatenated: `[g_r ‖ u_r]`, so an elementwise
    op on the fused output (SiluAndMul) stays local. `shard_id` is the output's index.
    """

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool = False,
                 parallel: ParallelContext | None = None):
        parallel = parallel or ParallelContext()
        self.output_sizes = [parallel.divide(s, "merged output features") for s in output_sizes]
        super().__init__(in_features, sum(output_sizes), bias, parallel)

    def weight_loader(self, param, loaded, shard_id=None, block=1):
        if shard_id is None:
            raise ValueError("MergedColumnParallelLinear needs a shard_id per checkpoint tensor")
        what = f"MergedColumnParallelLinear[{shard_id}]"
        size = _in_blocks(self.output_sizes[shard_id], block, what)
        offset = _in_blocks(sum(self.output_sizes[:shard_id]), block, what)
        target = param.data.narrow(0, offset, size)
        _copy_checked(target, loaded.narrow(0, self.parallel.tp_rank * size, size), "MergedColumnParallelLinear")


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections in one GEMM, heads split over ranks in whole GQA groups.

    KV heads that do not divide the ranks are split unevenly (SmolLM2's 3 KV heads over 2 ranks:
    2 + 1, with their 6 + 3 query heads); with fewer KV heads than ranks each KV head is replicated
    on `tp / num_kv_heads` ranks. Output per rank: `[q (Hq_local·D) ‖ k (Hkv_local·D) ‖ v (Hkv_local·D)]`;
    shard ids "q", "k", "v". `q_start` is this rank's first query head (`o_proj` takes the same heads).
    """

    def __init__(self, hidden_size: int, head_dim: int, total_num_heads: int, total_num_kv_heads: int,
                 bias: bool = False, parallel: ParallelContext | None = None):
        parallel = parallel or ParallelContext()
        tp = parallel.tp_size
        if total_num_heads % total_num_kv_heads:
            raise ValueError(f"{total_num_heads} query heads do not group over {total_num_kv_heads} KV heads")
        self.head_dim = head_dim
        if total_num_kv_heads >= tp:
            group = total_num_heads // total_num_kv_heads
            self.kv_start, self.num_kv_heads = parallel.split(total_num_kv_heads)
            self.q_start, self.num_heads = self.kv_start * group, self.num_kv_heads * group
            self.kv_replicas = 1
        else:
            if tp % total_num_kv_heads:
                raise ValueError(f"tensor-parallel size {tp} is not a multiple of {total_num_kv_heads} KV heads")
            self.num_heads = parallel.divide(total_num_heads, "attention heads")
            self.q_start = parallel.tp_rank * self.num_heads
            self.kv_replicas = tp // total_num_kv_heads
            self.kv_start, self.num_kv_heads = parallel.tp_rank // self.kv_replicas, 1
        out_local = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden_size, out_local * tp, bias, parallel, out_local=out_local)
        self.q_size = self.num_heads * head_dim
        self.kv_size = self.num_kv_heads * head_dim

    def weight_loader(self, param, loaded, shard_id=None, block=1):
        d = self.head_dim
        if shard_id == "q":
            offset, size, source = 0, self.q_size, self.q_start * d
        elif shard_id in ("k", "v"):
            offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
            size, source = self.kv_size, self.kv_start * d
        else:
            raise ValueError(f"QKVParallelLinear shard_id must be 'q', 'k' or 'v', got {shard_id!r}")
        what = f"QKVParallelLinear[{shard_id}]"
        offset, size, source = (_in_blocks(v, block, what) for v in (offset, size, source))
        target = param.data.narrow(0, offset, size)
        _copy_checked(target, loaded.narrow(0, source, size), f"QKVParallelLinear[{shard_id}]")


class RowParallelLinear(_LinearBase):
    """Input features split over ranks. Shard(-1) → Replicate (all-reduce), or Partial without
    `reduce_results` (the caller reduces later: the placement compiler reduces at the next norm,
    after fusing with another partial sum)."""

    input_placement = Shard(-1)

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 parallel: ParallelContext | None = None, reduce_results: bool = True,
                 input_split: tuple[int, int] | None = None):
        parallel = parallel or ParallelContext()
        # input_split: this rank's (start, size) of uneven input shards (the heads of QKVParallelLinear)
        self.input_start, in_local = input_split or (None, parallel.divide(in_features, "input features"))
        super().__init__(in_local, out_features, bias, parallel)
        self.output_placement = Replicate() if reduce_results else Partial()

    def weight_loader(self, param, loaded, shard_id=None, block=1):
        if param.dim() == 1:  # bias: added once, after the reduction
            _copy_checked(param, loaded, "RowParallelLinear bias")
            return
        size = param.shape[1]  # columns of this rank: weight columns, or blocks of them for block scales
        start = self.parallel.tp_rank * size if self.input_start is None else _in_blocks(self.input_start, block,
                                                                                         "RowParallelLinear")
        _copy_checked(param, loaded.narrow(1, start, size), "RowParallelLinear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, in / tp] -> [T, out]
        # The bias joins the partial sum on rank 0 only, so it is counted once after reduction.
        bias = self.bias if self.parallel.tp_rank == 0 else None
        y = self.scheme.apply(self, x, bias)
        return redistribute(y, Partial(), self.output_placement, self.parallel)
