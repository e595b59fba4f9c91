"""Layer-level checks of the tensor-parallel weight loaders and placements (no process group
needed: each rank's shard is built and loaded on its own, then the shards are reassembled)."""

from __future__ import annotations

import pytest
import torch
from lightspeed.layers import (
    ColumnParallelLinear,
    FusedMoE,
    MergedColumnParallelLinear,
    ParallelContext,
    ParallelLayout,
    ParallelLMHead,
    Partial,
    QKVParallelLinear,
    Replicate,
    RowParallelLinear,
    Shard,
    VocabParallelEmbedding,
    describe_placements,
    redistribute,
    split_sizes,
)


def _ranks(tp: int) -> list[ParallelContext]:
    return [ParallelContext(r, tp) for r in range(tp)]


def test_column_and_row_shards_reassemble():
    w, b = torch.randn(8, 6), torch.randn(8)
    cols = [ColumnParallelLinear(6, 8, bias=True, parallel=ctx) for ctx in _ranks(2)]
    for layer in cols:
        layer.weight.weight_loader(layer.weight, w)
        layer.bias.weight_loader(layer.bias, b)
    assert torch.equal(torch.cat([c.weight for c in cols]), w) and torch.equal(torch.cat([c.bias for c in cols]), b)
    assert cols[0].input_placement == Replicate() and cols[0].output_placement == Shard(-1)
    rows = [RowParallelLinear(8, 6, parallel=ctx, reduce_results=False) for ctx in _ranks(2)]
    w2 = torch.randn(6, 8)
    for layer in rows:
        layer.weight.weight_loader(layer.weight, w2)
    assert torch.equal(torch.cat([r.weight for r in rows], dim=1), w2) and rows[0].output_placement == Partial()
    # Column then row parallel, summed over ranks (the all-reduce), equals the unsharded product.
    x = torch.randn(3, 6)
    partial = sum(r(c(x)) for c, r in zip(cols, rows, strict=True))
    torch.testing.assert_close(partial, (x @ w.T + b) @ w2.T)


def test_merged_and_qkv_shard_ids():
    gate, up = torch.randn(4, 3), torch.randn(4, 3)
    shards = [MergedColumnParallelLinear(3, [4, 4], parallel=ctx) for ctx in _ranks(2)]
    for layer in shards:
        layer.weight.weight_loader(layer.weight, gate, 0)
        layer.weight.weight_loader(layer.weight, up, 1)
    # Each rank holds [its gate rows ‖ its up rows], so silu(gate)·up stays local.
    assert torch.equal(shards[1].weight, torch.cat([gate[2:], up[2:]]))
    q, k, v = torch.randn(8, 5), torch.randn(2, 5), torch.randn(2, 5)  # 4 q heads, 1 kv head, D=2
    qkv = [QKVParallelLinear(5, 2, 4, 1, parallel=ctx) for ctx in _ranks(2)]
    for layer in qkv:
        for shard_id, tensor in (("q", q), ("k", k), ("v", v)):
            layer.weight.weight_loader(layer.weight, tensor, shard_id)
    assert qkv[0].kv_replicas == 2 and qkv[1].num_kv_heads == 1
    assert torch.equal(qkv[1].weight, torch.cat([q[4:], k, v]))  # the one KV head replicated
    with pytest.raises(ValueError, match="shard_id"):
        qkv[0].weight.weight_loader(qkv[0].weight, q, "x")
    with pytest.raises(ValueError, match="not divisible"):
        QKVParallelLinear(5, 2, 3, 1, parallel=ParallelContext(0, 2))


def test_vocab_parallel_padding_and_tied_head():
    table = torch.randn(7, 4)
    shards = [VocabParallelEmbedding(7, 4, parallel=ctx) for ctx in _ranks(2)]
    for layer in shards:
        layer.weight.weight_loader(layer.weight, table)
    assert shards[1].vocab_start == 4 and shards[1].vocab_end == 7
    assert torch.equal(shards[1].weight[:3], table[4:]) and torch.all(shards[1].weight[3] == 0)  # padding row
    head = ParallelLMHead(7, 4)
    embedding = VocabParallelEmbedding(7, 4)
    head.tie_to(embedding)
    embedding.weight.weight_loader(embedding.weight, table)
    hidden = torch.randn(2, 4)
    logits = head(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (2, 7)
    torch.testing.assert_close(logits, hidden @ table.T)


def test_moe_loaders_per_expert_and_stacked_agree():
    experts, hidden, inter = 3, 4, 6
    w1, w3, w2 = torch.randn(experts, inter, hidden), torch.randn(experts, inter, hidden), torch.randn(experts, hidden, inter)
    for ctx in _ranks(2):
        per_expert, stacked = (FusedMoE(experts, 2, hidden, inter, parallel=ctx) for _ in range(2))
        for e in range(experts):
            per_expert.weight_loader(per_expert.w13_weight, w1[e], "w1", e)
            per_expert.weight_loader(per_expert.w13_weight, w3[e], "w3", e)
            per_expert.weight_loader(per_expert.w2_weight, w2[e], "w2", e)
        stacked.weight_loader(stacked.w13_weight, torch.cat([w1, w3], dim=1), "w13")
        stacked.weight_loader(stacked.w2_weight, w2, "w2")
        assert torch.equal(per_expert.w13_weight, stacked.w13_weight)
        assert torch.equal(per_expert.w2_weight, stacked.w2_weight)
        half = slice(ctx.tp_rank * 3, ctx.tp_rank * 3 + 3)
        assert torch.equal(stacked.w13_weight[:, :3], w1[:, half]) and torch.equal(stacked.w2_weight, w2[:, :, half])


def test_redistribute_single_rank_is_identity_and_bad_pairs_fail():
    x = torch.randn(2, 3)
    assert redistribute(x, Partial(), Replicate(), ParallelContext()) is x
    with pytest.raises(ValueError, match="no redistribution"):
        redistribute(x, Replicate(), Partial(), ParallelContext(0, 2))
    with pytest.raises(ValueError, match="rank"):
        ParallelContext(2, 2)


def test_uneven_heads_split_in_whole_kv_groups():
    # SmolLM2: 9 query heads in 3 KV groups over 2 ranks -> ranks hold KV heads {0, 1} and {2}.
    d, q, k, v = 2, torch.randn(18, 5), torch.randn(6, 5), torch.randn(6, 5)
    shards = [QKVParallelLinear(5, d, 9, 3, parallel=ctx) for ctx in _ranks(2)]
    assert [(s.q_start, s.num_heads, s.kv_start, s.num_kv_heads) for s in shards] == [(0, 6, 0, 2), (6, 3, 2, 1)]
    for layer in shards:
        for shard_id, tensor in (("q", q), ("k", k), ("v", v)):
            layer.weight.weight_loader(layer.weight, tensor, shard_id)
    assert torch.equal(shards[1].weight, torch.cat([q[12:], k[4:], v[4:]]))
    rows = [RowParallelLinear(18, 4, parallel=ctx, input_split=(s.q_start * d, s.q_size))
            for ctx, s in zip(_ranks(2), shards, strict=True)]
    w = torch.randn(4, 18)
    for layer in rows:
        layer.weight.weight_loader(layer.weight, w)
    assert torch.equal(torch.cat([r.weight for r in rows], dim=1), w)
    assert ParallelContext(1, 2).split(9, 3) == (6, 3) and split_sizes(3, 2) == [2, 1]
    with pytest.raises(ValueError, match="cannot be split"):
        ParallelContext(2, 3).split(2)


def test_expert_parallel_loader_keeps_whole_local_experts():
    experts, hidden, inter = 4, 3, 2
    w13, w2 = torch.randn(experts, 2 * inter, hidden), torch.randn(experts, hidden, inter)
    for ctx in _ranks(2):
        layer = FusedMoE(experts, 2, hidden, inter, parallel=ctx, expert_parallel=True)
        for e in range(experts):  # per expert: the other rank's experts are skipped
            layer.weight_loader(layer.w13_weight, w13[e], "w13", e)
            layer.weight_loader(layer.w2_weight, w2[e], "w2", e)
        mine = slice(2 * ctx.tp_rank, 2 * ctx.tp_rank + 2)
        assert torch.equal(layer.w13_weight, w13[mine]) and torch.equal(layer.w2_weight, w2[mine])
        ids = torch.tensor([[0, 3], [1, 2]])
        assert layer.local_ids(ids).tolist() == ([[0, -1], [1, -1]] if ctx.tp_rank == 0 else [[-1, 1], [-1, 0]])


def test_compiler_reduces_once_per_boundary():
    # No process group is needed to compile: the boundaries only record the collectives.
    from lightspeed.models import build_model, preset_config

    config = preset_config("tiny-deepseek-v3")
    ctx = ParallelContext(0, 2)
    model = build_model(config, ParallelLayout.of(ctx))
    lines = describe_placements(model)
    assert len(lines) == 2 * config.num_hidden_layers + 1
    assert all("Partial() -> Replicate() -> Replicate()" in line for line in lines[1:])  # one all-reduce each
    moe = model.model.layers[1].mlp
    # routed and shared experts are summed as partial sums: the MoE block is reduced once, at the next norm
    assert moe.experts.output_placement == Partial() and moe.shared_experts.down_proj.output_placement == Partial()
    sharded = build_model(config, ParallelLayout(ctx, ctx, ctx, expert_parallel=True, sequence_parallel=True))
    moe = sharded.model.layers[1].mlp
    assert moe.input_placement == Shard(0) and moe.shared_experts.down_proj.parallel.tp_size == 1
    boundary = sharded.model.layers[1].post_attention_layernorm.boundary
    assert (boundary.incoming, boundary.stream, boundary.outgoing) == (Partial(), Shard(0), Shard(0))
    final = sharded.model.norm.boundary
    assert (final.incoming, final.stream, final.outgoing) == (Shard(0), Shard(0), Replicate())
    assert describe_placements(build_model(config)) == []  # one rank: nothing inserted
