"""The placement compiler: the collectives of a decoder model, decided once from its annotations.

Design note (DESIGN §6). A pre-norm decoder layer is two blocks (attention, MLP / MoE) joined by
a residual stream; every block declares the placement its input needs (`input_placement`) and
names the leaf layers whose outputs it sums (`output_layers`). Left alone, each row-parallel leaf
would all-reduce its own output. The compiler instead
- turns those leaves' outputs into `Partial` (no collective inside the block), so a block whose
  leaves are summed (DeepSeek's routed + shared experts) is reduced once, not once per leaf;
- chooses the placement of the residual stream: `Replicate`, or `Shard(0)` (tokens split over the
  attention group: sequence parallelism, or an expert-parallel MoE that takes distinct tokens);
- installs on every norm a `Boundary` that turns the incoming block output into the stream
  (all-reduce, or reduce-scatter for a sharded stream), adds the residual and normalises (one
  fused residual-add + RMSNorm kernel; `allreduce_residual_rmsnorm` is the seam where a fused
  all-reduce + add + norm kernel plugs in), then hands the next block its input placement
  (all-gather when the stream is sharded and the block needs every token).
So per boundary there is exactly one reduction and at most one gather, whatever the groups.

Token shards pad the step's tokens to a multiple of the group size (`StepTokens.rows_per_rank`);
padding rows are zeros, flow through harmlessly and are dropped by the final gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightspeed_kernel import ops
from torch import nn

from .parallel import (
    ParallelContext,
    ParallelLayout,
    Partial,
    Placement,
    Replicate,
    Shard,
    all_gather_rows,
    reduce_scatter_rows,
)

TOKENS = Shard(0)


class StepTokens:
    """What the collectives of one model need to know about the step being run: its token count,
    which rows are real tokens, and (data-parallel attention) the count every rank pads to.
    The model sets it at the start of each forward; the runner sets `pad_to`."""

    def __init__(self) -> None:
        self.num_tokens = 0
        self.pad_to: int | None = None  # data-parallel attention: the largest token count of the step
        self._slot_mapping: torch.Tensor | None = None
        self._valid: dict[int, torch.Tensor] = {}

    def start(self, num_tokens: int, slot_mapping: torch.Tensor | None) -> None:
        self.num_tokens, self._slot_mapping, self._valid = num_tokens, slot_mapping, {}

    def rows_per_rank(self, size: int) -> int:
        """Rows of each rank's token shard over a group of `size` ranks."""
        return -(-max(self.num_tokens, self.pad_to or 0) // size)

    def valid_rows(self, shard: ParallelContext | None = None) -> torch.Tensor | None:
        """bool mask of the rows that are real tokens (slot >= 0: not CUDA-graph or shard padding),
        `[T]`, or this rank's `[C]` of the token shard over `shard`; None when unknown."""
        if self._slot_mapping is None:
            return None
        key = 0 if shard is None else shard.tp_size
        if key not in self._valid:
            valid = self._slot_mapping >= 0
            if shard is not None:
                valid = shard_tokens(valid, shard, self)
            self._valid[key] = valid
        return self._valid[key]


def _pad_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    return x if x.shape[0] == rows else F.pad(x, (0, 0) * (x.dim() - 1) + (0, rows - x.shape[0]))


def shard_tokens(x: torch.Tensor, ctx: ParallelContext, tokens: StepTokens) -> torch.Tensor:
    """Replicate `[T, ...]` -> this rank's `[C, ...]` token shard (a local slice of the padded rows;
    a group of one keeps all `T` rows unpadded)."""
    if ctx.tp_size == 1:
        return x
    rows = tokens.rows_per_rank(ctx.tp_size)
    return _pad_rows(x, rows * ctx.tp_size)[ctx.tp_rank * rows:(ctx.tp_rank + 1) * rows]


def to_placement(x: torch.Tensor, src: Placement, dst: Placement, ctx: ParallelContext,
                 tokens: StepTokens) -> torch.Tensor:
    """`redistribute` for the residual stream, padding token shards to the step's shard size."""
    if src == dst or ctx.tp_size == 1:
        return x
    if dst == TOKENS:
        if isinstance(src, Partial):
            return reduce_scatter_rows(_pad_rows(x, tokens.rows_per_rank(ctx.tp_size) * ctx.tp_size), ctx)
        if isinstance(src, Replicate):
            return shard_tokens(x, ctx, tokens)
    if isinstance(dst, Replicate):
        if isinstance(src, Partial):
            x = x.contiguous()
            dist.all_reduce(x, group=ctx.group)
            return x
        if src == TOKENS:
            return all_gather_rows(x, ctx)[: tokens.num_tokens]
    raise ValueError(f"no residual-stream redistribution from {src} to {dst}")


def allreduce_residual_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                               ctx: ParallelContext) -> tuple[torch.Tensor, torch.Tensor]:
    """`rmsnorm(all_reduce(x) + residual)` and the new residual. Composed from an all-reduce and the
    fused add + norm kernel; a one-shot all-reduce kernel fused with both (FlashInfer's
    trtllm_allreduce_fusion class) is the GPU candidate for small token counts, not wired yet."""
    x = x.contiguous()
    dist.all_reduce(x, group=ctx.group)
    return ops.fused_add_rms_norm(x, residual, weight, eps)


class Boundary:
    """The collectives around one norm of the residual stream: incoming block output -> stream
    placement (+ residual, norm) -> the next block's input placement."""

    def __init__(self, incoming: Placement, stream: Placement, outgoing: Placement, ctx: ParallelContext,
                 tokens: StepTokens):
        self.incoming, self.stream, self.outgoing = incoming, stream, outgoing
        self.ctx, self.tokens = ctx, tokens

    def apply(self, norm: nn.Module, x: torch.Tensor, residual: torch.Tensor | None):
        """(normed input of the next block, residual) from a block output `x` and the residual;
        `residual=None` starts the stream (the embedding output, Replicate)."""
        ctx, tokens = self.ctx, self.tokens
        if residual is None:
            residual = to_placement(x, Replicate(), self.stream, ctx, tokens)
            out = ops.rms_norm(residual, norm.weight, norm.eps)
        elif isinstance(self.incoming, Partial) and isinstance(self.stream, Replicate):
            out, residual = allreduce_residual_rmsnorm(x, residual, norm.weight, norm.eps, ctx)
        else:
            x = to_placement(x, self.incoming, self.stream, ctx, tokens)
            out, residual = ops.fused_add_rms_norm(x, residual, norm.weight, norm.eps)
        return to_placement(out, self.stream, self.outgoing, ctx, tokens), residual

    def __repr__(self) -> str:
        return f"Boundary({self.incoming} -> {self.stream} -> {self.outgoing}, tp={self.ctx.tp_size})"


def _block_placements(block: nn.Module, name: str) -> tuple[Placement, Placement]:
    """(input, output) placement of a block, with its output leaves switched to Partial."""
    incoming = getattr(block, "input_placement", Replicate())
    outputs = set()
    for path in block.output_layers:
        try:
            leaf = block.get_submodule(path)
        except AttributeError:
            continue  # optional leaf absent (no shared experts)
        if leaf.parallel.tp_size == 1:
            outputs.add(incoming)  # replicated weights: computed on whatever tokens come in
            continue
        if leaf.output_placement == Replicate():
            leaf.output_placement = Partial()  # reduced at the next boundary instead
        outputs.add(leaf.output_placement)
    if len(outputs) != 1:
        raise ValueError(f"{name}: outputs placed {sorted(map(str, outputs))} cannot be summed")
    return incoming, outputs.pop()


def compile_placements(model: nn.Module, layout: ParallelLayout) -> None:
    """Insert the collectives of `model` (a causal LM whose `model.model` has `layers` of pre-norm
    decoder layers: `input_layernorm`, `self_attn`, `post_attention_layernorm`, `mlp`, and a final
    `norm`) for `layout`. Also wires every MoE layer to the step's token facts. Idempotent per model."""
    body = model.model
    tokens: StepTokens = body.tokens
    ctx = layout.attention
    stream = TOKENS if (layout.sequence_parallel or layout.moe_tokens_sharded) else Replicate()
    for module in model.modules():
        if hasattr(module, "step_tokens"):
            module.step_tokens = tokens
            module.step_tokens_shard = ctx if stream == TOKENS else None
    if ctx.tp_size == 1 and not layout.moe_tokens_sharded:
        return  # one rank per attention group, experts replicated or reduced inside: nothing to insert
    incoming: Placement = Replicate()  # the embedding's output
    for i, layer in enumerate(body.layers):
        attn_in, attn_out = _block_placements(layer.self_attn, f"layer {i} attention")
        mlp_in, mlp_out = _block_placements(layer.mlp, f"layer {i} MLP")
        layer.input_layernorm.boundary = Boundary(incoming, stream, attn_in, ctx, tokens)
        layer.post_attention_layernorm.boundary = Boundary(attn_out, stream, mlp_in, ctx, tokens)
        incoming = mlp_out
    body.norm.boundary = Boundary(incoming, stream, Replicate(), ctx, tokens)


def describe_placements(model: nn.Module) -> list[str]:
    """One line per norm boundary: what the compiler inserted (logs and tests)."""
    lines = []
    for name, module in model.named_modules():
        boundary = getattr(module, "boundary", None)
        if boundary is not None:
            lines.append(f"{name}: {boundary!r}")
    return lines
