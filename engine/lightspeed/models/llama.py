"""Llama (Llama 2/3.x incl. rope scaling, SmolLM2): the base decoder the other families extend."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..layers import (
    Attention,
    AttentionMetadata,
    MergedColumnParallelLinear,
    ParallelContext,
    ParallelLayout,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    SiluAndMul,
    StepTokens,
    VocabParallelEmbedding,
)
from .config import ModelConfig
from .weights import LLAMA_STACKED_PARAMS, load_stacked_weights


class LlamaMLP(nn.Module):
    """SwiGLU: `down(silu(gate(x)) * up(x))`. Replicate → Replicate (column- then row-parallel;
    Partial once the placement compiler defers the reduction to the next norm)."""

    output_layers = ("down_proj",)  # leaves whose outputs form the block's (placement compiler)

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool, parallel: ParallelContext):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias, parallel)
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias, parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return self.finish(self.gate_up_proj(x))

    def finish(self, gate_up: torch.Tensor) -> torch.Tensor:
        """Everything after the gate/up projection: [T, 2I] -> [T, H]. The activation and the down
        projection go as one op where a kernel may fold the activation in."""
        return self.act_fn.then_linear(self.down_proj, gate_up)


class LlamaAttention(nn.Module):
    """Self-attention: fused QKV, RoPE, paged attention, output projection. Replicate → Replicate."""

    o_proj_bias: bool | None = None  # None: same as the q/k/v bias (Llama); Qwen2 sets False
    output_layers = ("o_proj",)

    def __init__(self, config: ModelConfig, layer_idx: int, parallel: ParallelContext,
                 rotary_emb: RotaryEmbedding):
        super().__init__()
        d = config.head_dim
        self.qkv_proj = QKVParallelLinear(config.hidden_size, d, config.num_attention_heads,
                                          config.num_key_value_heads, config.attention_bias, parallel)
        o_bias = config.attention_bias if self.o_proj_bias is None else self.o_proj_bias
        # o_proj takes the heads QKV gave this rank (uneven when KV heads do not divide the ranks).
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, o_bias, parallel,
                                        input_split=(self.qkv_proj.q_start * d, self.qkv_proj.q_size))
        self.num_heads, self.num_kv_heads, self.head_dim = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, d
        self.rotary_emb = rotary_emb  # shared by all layers: one cos/sin cache
        self.attn = Attention(self.num_heads, d, self.num_kv_heads, layer_idx)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head normalisation before RoPE; none in Llama."""
        return q, k

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.attend(positions, self.qkv_proj(hidden), meta)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Everything after the QKV projection: qkv [T, (Hq + 2·Hkv)·D] -> [T, H]."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([self.qkv_proj.q_size, self.qkv_proj.kv_size, self.qkv_proj.kv_size], dim=-1)
        q = q.reshape(num_tokens, self.num_heads, self.head_dim)
        k = k.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(num_tokens, self.num_kv_heads, self.head_dim)
        q, k = self.qk_norm(q, k)
        out = self.attn(q, k, v, meta, self.rotary_emb, positions)  # RoPE fused with the KV store; [T, Hq, D]
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block; carries the residual stream separately so norms fuse the residual add (and,
    under tensor parallelism, the collectives the placement compiler puts on them)."""

    attention_cls: type[nn.Module] = LlamaAttention

    def __init__(self, config: ModelConfig, layer_idx: int, parallel: ParallelLayout,
                 rotary_emb: RotaryEmbedding):
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_idx, parallel.attention, rotary_emb)
        self.mlp = self.build_mlp(config, layer_idx, parallel)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def build_mlp(self, config: ModelConfig, layer_idx: int, parallel: ParallelLayout) -> nn.Module:
        return LlamaMLP(config.hidden_size, config.intermediate_size, config.mlp_bias, parallel.dense)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        # Each norm goes into the projection after it as one op where that projection is Llama's own
        # (a kernel may fold the norm in); other attention / MLP blocks (MLA, MoE) take the normed input.
        if isinstance(self.self_attn, LlamaAttention):
            qkv, residual = self.input_layernorm.then_linear(self.self_attn.qkv_proj, hidden, residual)
            hidden = self.self_attn.attend(positions, qkv, meta)
        else:
            if residual is None:
                hidden, residual = self.input_layernorm.start(hidden)
            else:
                hidden, residual = self.input_layernorm(hidden, residual)
            hidden = self.self_attn(positions, hidden, meta)
        if isinstance(self.mlp, LlamaMLP):
            gate_up, residual = self.post_attention_layernorm.then_linear(self.mlp.gate_up_proj, hidden, residual)
            return self.mlp.finish(gate_up), residual
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm: `(input_ids [T], positions [T], meta) -> [T, H]`.

    `aux_hidden_layers`: layers whose input hidden states a forward keeps, concatenated, in
    `aux_hidden_states` [T, n·H] (an EAGLE-3 draft head reads them); empty by default."""

    aux_hidden_layers: tuple[int, ...] = ()
    aux_hidden_states: torch.Tensor | None = None

    def __init__(self, config: ModelConfig, parallel: ParallelLayout, layer_cls: type[LlamaDecoderLayer]):
        super().__init__()
        self.tokens = StepTokens()  # the step's token facts, read by the collectives and MoE layers
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel.attention)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                          config.rope_scaling)
        self.layers = nn.ModuleList(layer_cls(config, i, parallel, self.rotary_emb)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        self.tokens.start(input_ids.shape[0], meta.slot_mapping)
        hidden = self.embed_tokens(input_ids)
        residual = None
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_hidden_layers:  # in layer order, once per listing (a short model repeats one)
                aux += [hidden if residual is None else hidden + residual] * self.aux_hidden_layers.count(i)
            hidden, residual = layer(positions, hidden, residual, meta)
        self.aux_hidden_states = torch.cat(aux, dim=-1) if aux else None
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """The engine's model interface (engine/README.md):

    - `forward(input_ids int64 [T], positions int64 [T], meta) -> hidden [T, H]`
    - `compute_logits(hidden [S, H]) -> float32 [S, V]`
    - `load_weights(Iterable[(hf_name, tensor)]) -> set of parameter names loaded`
    """

    model_cls: type[nn.Module] = LlamaModel
    layer_cls: type[nn.Module] = LlamaDecoderLayer
    stacked_params = LLAMA_STACKED_PARAMS

    def __init__(self, config: ModelConfig, parallel: ParallelLayout | ParallelContext | None = None):
        super().__init__()
        self.config = config
        self.parallel = ParallelLayout.of(parallel)
        self.model = self.model_cls(config, self.parallel, self.layer_cls)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, self.parallel.attention)
        if config.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_stacked_weights(self, weights, self.stacked_params, self.config.tie_word_embeddings)
