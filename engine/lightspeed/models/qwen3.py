"""Qwen3 (dense): the Llama block with an RMSNorm over each query and key head before RoPE."""

from __future__ import annotations

import torch

from ..layers import ParallelContext, RMSNorm, RotaryEmbedding
from .config import ModelConfig
from .llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """Adds `q_norm` / `k_norm` (weights `[head_dim]`, shared by all heads)."""

    def __init__(self, config: ModelConfig, layer_idx: int, parallel: ParallelContext,
                 rotary_emb: RotaryEmbedding):
        super().__init__(config, layer_idx, parallel, rotary_emb)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [T, Hq, D], k: [T, Hkv, D]; the norm kernel takes rows of D features.
        q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        return q, k


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Same interface as `LlamaForCausalLM`; checkpoints add `self_attn.{q,k}_norm.weight`."""

    layer_cls = Qwen3DecoderLayer
