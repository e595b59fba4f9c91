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
    ParallelLMHead,
    Partial,
    QKVParallelLinear,
    Replicate,
    RowParallelLinear,
    Shard,
    VocabParallelEmbedding,
    redistribute,
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
