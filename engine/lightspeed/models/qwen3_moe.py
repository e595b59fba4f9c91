"""Qwen3-MoE (e.g. Qwen3-30B-A3B): Qwen3 attention with sparse MoE feed-forward blocks.

Checkpoints name experts one by one (`mlp.experts.{e}.{gate,up,down}_proj.weight`, as saved by
transformers and published on the hub); transformers 5 holds them stacked in memory
(`mlp.experts.gate_up_proj [E, 2I, H]`, `mlp.experts.down_proj [E, H, I]`). Both load.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..layers import FusedMoE, ParallelLayout, ReplicatedLinear
from .config import ModelConfig
from .llama import LlamaMLP
from .qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM
from .weights import load_stacked_weights, route_expert_weights


class Qwen3MoeSparseMoeBlock(nn.Module):
    """Router (`gate`, replicated) + fused experts (tensor or expert parallel). Replicate → Partial
    (reduced at the next norm), or Shard(0) → Shard(0) when the experts take token shards."""

    output_layers = ("experts",)

    def __init__(self, config: ModelConfig, parallel: ParallelLayout):
        super().__init__()
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=False)
        self.experts = FusedMoE(config.num_experts, config.num_experts_per_tok, config.hidden_size,
                                config.moe_intermediate_size, renormalize=config.norm_topk_prob,
                                parallel=parallel.moe, expert_parallel=parallel.expert_parallel,
                                tokens_sharded=parallel.moe_tokens_sharded)

    @property
    def input_placement(self):
        return self.experts.input_placement

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.experts(x, self.gate(x))


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    """MoE feed-forward on sparse layers, a dense SwiGLU MLP on `mlp_only_layers`."""

    def build_mlp(self, config: ModelConfig, layer_idx: int, parallel: ParallelLayout) -> nn.Module:
        if config.is_moe_layer(layer_idx):
            return Qwen3MoeSparseMoeBlock(config, parallel)
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, parallel.dense)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Same interface as `LlamaForCausalLM`."""

    layer_cls = Qwen3MoeDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = set()
        dense = route_expert_weights(dict(self.named_parameters()), weights, loaded)
        loaded |= load_stacked_weights(self, dense, self.stacked_params, self.config.tie_word_embeddings)
        return loaded
