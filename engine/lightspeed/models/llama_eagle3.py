"""EAGLE-3 draft head for Llama-3 targets (Li et al., 2025), as the checkpoints on the Hub ship it.

The head is one Llama decoder layer whose attention reads twice the hidden width: at draft
position i it takes the target's token i+1 (embedded with the target's embedding) and a feature
of position i, and predicts token i+2 over its own, smaller vocabulary (`d2t` maps a draft id to
a target id: target = draft + d2t[draft]). The first pass's feature is `fc` of three of the
target's hidden states (before layers `aux_layers`, default 2, L/2 and L-3, as vLLM captures
them); later passes feed back the head's own pre-norm output.

    x = attn_in = [input_layernorm(embed(t_{i+1})) ‖ hidden_norm(f_i)]    (2H)
    h = f_i + o_proj(attention(x));  h' = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(h'))  (draft vocabulary);  f_{i+1} = h'

Checkpoint names: `fc.weight` [H, 3H], `midlayer.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
input_layernorm, hidden_norm, post_attention_layernorm}.weight`, `norm.weight`, `lm_head.weight`
[draft_vocab, H], `d2t` [draft_vocab] (int64 offsets), `t2d` (unused). Its attention caches into
`kv_caches[layer_idx]` (one layer past the target's) with the target's KV shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..layers import (
    Attention,
    AttentionMetadata,
    ParallelContext,
    QKVParallelLinear,
    ReplicatedLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
)
from .llama import LlamaMLP
from .weights import LLAMA_STACKED_PARAMS, load_stacked_weights

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int          # the target vocabulary it was trained for
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    aux_layers: tuple[int, ...] | None  # target layers whose input hidden states feed fc (None: default)

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], name: str) -> Eagle3Config:
        archs = hf.get("architectures") or []
        if archs and archs[0] not in ARCHITECTURES:
            raise ValueError(f"{name}: architecture {archs[0]!r} is not an EAGLE-3 head ({', '.join(ARCHITECTURES)})")
        try:
            hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
            aux = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            return cls(hidden, heads, int(hf.get("num_key_value_heads") or heads),
                       int(hf.get("head_dim") or hidden // heads), int(hf["intermediate_size"]),
                       int(hf["vocab_size"]), int(hf.get("draft_vocab_size") or hf["vocab_size"]),
                       float(hf.get("rms_norm_eps", 1e-6)), float(hf.get("rope_theta", 10000.0)),
                       hf.get("rope_scaling"), int(hf.get("max_position_embeddings", 4096)),
                       tuple(int(x) for x in aux) if aux else None)
        except KeyError as e:
            raise ValueError(f"{name}: EAGLE-3 config lacks {e.args[0]!r}") from None


class _Eagle3Attention(nn.Module):
    def __init__(self, config: Eagle3Config, layer_idx: int, parallel: ParallelContext):
        super().__init__()
        d = config.head_dim
        self.qkv_proj = QKVParallelLinear(2 * config.hidden_size, d, config.num_attention_heads,
                                          config.num_key_value_heads, False, parallel)
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, False, parallel)
        self.rotary_emb = RotaryEmbedding(d, config.max_position_embeddings, config.rope_theta, config.rope_scaling)
        self.attn = Attention(self.qkv_proj.num_heads, d, self.qkv_proj.num_kv_heads, layer_idx)
        self.head_dim = d

    def forward(self, positions: torch.Tensor, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size], dim=-1)
        q = q.reshape(num_tokens, -1, self.head_dim)
        k = k.reshape(num_tokens, -1, self.head_dim)
        v = v.reshape(num_tokens, -1, self.head_dim)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, meta).reshape(num_tokens, -1))


class _Eagle3Layer(nn.Module):
    def __init__(self, config: Eagle3Config, layer_idx: int, parallel: ParallelContext):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = _Eagle3Attention(config, layer_idx, parallel)
        self.mlp = LlamaMLP(h, config.intermediate_size, False, parallel)
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)


class Eagle3Head(nn.Module):
    """`forward(input_ids [T], positions [T], feature [T, 3H or H], meta) -> (normed [T, H], prenorm [T, H])`,
    `compute_logits(normed [S, H]) -> float32 [S, V_target]` (-inf off the draft vocabulary)."""

    def __init__(self, config: Eagle3Config, target: nn.Module, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        h = config.hidden_size
        self.fc = ReplicatedLinear(3 * h, h, bias=False)
        self.midlayer = _Eagle3Layer(config, layer_idx, ParallelContext())
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = ReplicatedLinear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.int64))
        self._target = (target,)  # its embedding is shared; not registered as a submodule

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, feature: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if feature.shape[-1] != self.config.hidden_size:
            feature = self.fc(feature)
        layer = self.midlayer
        embeds = self._target[0].model.embed_tokens(input_ids)
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(feature)], dim=-1)
        hidden, residual = layer.post_attention_layernorm(layer.self_attn(positions, x, meta), feature)
        prenorm = residual + layer.mlp(hidden)
        return self.norm(prenorm), prenorm

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        draft = self.lm_head(normed).float()  # [S, draft_vocab]
        logits = draft.new_full((draft.shape[0], self.config.vocab_size), float("-inf"))
        return logits.index_copy_(1, torch.arange(draft.shape[1], device=draft.device) + self.d2t, draft)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def mine():
            for name, tensor in weights:
                name = name.removeprefix("model.")
                if name == "t2d" or name.startswith("embed_tokens."):
                    continue  # unused mask; the target's embedding is used
                if name == "d2t":
                    self.d2t.copy_(tensor.to(torch.int64))
                    continue
                yield name, tensor

        return load_stacked_weights(self, mine(), LLAMA_STACKED_PARAMS)
