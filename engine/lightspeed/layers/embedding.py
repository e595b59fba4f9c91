"""Vocabulary-parallel token embedding and LM head.

The vocabulary is padded to a multiple of `tp_size` and split in contiguous ranges: rank r owns
token ids `[r·Vp, (r+1)·Vp)`. The embedding looks up the ids it owns and zeroes the rest
(Partial → Replicate by all-reduce); the LM head computes the logits of its range
(Shard(-1) → Replicate by all-gather) and drops the padding.
"""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .parallel import ParallelContext, Partial, Replicate, Shard, redistribute


class VocabParallelEmbedding(nn.Module):
    """`weight [V_local, H]`; forward(ids int64 [T]) -> [T, H]. Replicate ids → Replicate rows."""

    input_placement = Replicate()
    output_placement = Replicate()

    def __init__(self, num_embeddings: int, embedding_dim: int, parallel: ParallelContext | None = None):
        super().__init__()
        self.parallel = parallel or ParallelContext()
        tp = self.parallel.tp_size
        self.num_embeddings = num_embeddings
        self.per_rank = -(-num_embeddings // tp)
        self.vocab_start = self.parallel.tp_rank * self.per_rank
        self.vocab_end = min(self.vocab_start + self.per_rank, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.per_rank, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.num_embeddings or loaded.shape[1:] != param.shape[1:]:
            raise ValueError(f"embedding: checkpoint shape {tuple(loaded.shape)} != "
                             f"({self.num_embeddings}, {param.shape[1]})")
        rows = self.vocab_end - self.vocab_start
        # narrow, not slicing: the weight may be a QuantizedWeight (layers/weight_only.py)
        param.data.narrow(0, 0, rows).copy_(loaded.narrow(0, self.vocab_start, rows))
        if rows < self.per_rank:
            param.data.narrow(0, rows, self.per_rank - rows).zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, H]
        if self.parallel.tp_size == 1:
            return ops.embedding(input_ids, self.weight)
        owned = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(owned, input_ids - self.vocab_start, 0)
        rows = ops.embedding(local_ids, self.weight) * owned.unsqueeze(-1).to(self.weight.dtype)
        return redistribute(rows, Partial(), Replicate(), self.parallel)

    def extra_repr(self) -> str:
        return f"vocab={self.num_embeddings}, dim={self.weight.shape[1]}, tp={self.parallel.tp_size}"


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the vocabulary. Replicate hidden → Replicate float32 logits.

    With tied word embeddings call `tie_to(embedding)`: both modules then share one parameter.
    """

    output_placement = Replicate()

    def tie_to(self, embedding: VocabParallelEmbedding) -> None:
        if embedding.weight.shape != self.weight.shape:
            raise ValueError("tied LM head and embedding must have the same shape")
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [S, H] -> float32 [S, V]
        logits = ops.linear(hidden, self.weight)
        logits = redistribute(logits, Shard(-1), Replicate(), self.parallel)
        return logits[:, : self.num_embeddings].float()
