"""DeepSeek-V2 / V3 and Kimi-K2 (`DeepseekV3ForCausalLM` with Kimi's config): multi-head latent
attention + DeepSeekMoE.

- Attention: `layers.MLAAttention` (q LoRA or a plain q_proj, a 512-wide latent + 64-wide rope key
  per token in the cache, absorbed decode / non-absorbed or absorbed prefill through `mla/*`), YaRN
  rope on interleaved pairs with DeepSeek's mscale softmax correction.
- Feed-forward: dense SwiGLU for the first `first_k_dense_replace` layers, then DeepSeekMoE:
  shared experts always on, plus routed experts chosen by softmax (V2) or sigmoid scores with
  `e_score_correction_bias` (V3 `noaux_tc`), grouped top-k (`n_group` / `topk_group`), weights
  renormalised when `norm_topk_prob`, times `routed_scaling_factor`.
- FP8 checkpoints (e4m3 + `weight_scale_inv` per 128x128 block) load as FP8 (`layers.quantization`).
- Multi-token prediction modules (`num_nextn_predict_layers`, checkpoint layers >= num_hidden_layers)
  are not part of this model: `DeepseekMTP` (deepseek_mtp.py) loads and runs them.

V2's router keeps transformers' semantics for `norm_topk_prob=False` (every published V2 config):
softmax top-k weights times `routed_scaling_factor`, no renormalisation.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from ..layers import (
    FusedMoE,
    MLAAttention,
    MLABackend,
    MoEGate,
    ParallelContext,
    ParallelLayout,
    RMSNorm,
    RotaryEmbedding,
    StepTokens,
    VocabParallelEmbedding,
    mla_softmax_scale,
)
from .config import ModelConfig
from .llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP, LlamaModel
from .weights import load_stacked_weights, route_expert_weights

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
# Only gate ‖ up fuse: MLA's projections load by their own names (`q_proj` is not Llama's fused qkv).
DEEPSEEK_STACKED_PARAMS = ((".gate_up_proj.", ".gate_proj.", 0), (".gate_up_proj.", ".up_proj.", 1))


class DeepseekMoE(nn.Module):
    """Shared experts + routed experts, summed before the one reduction of the block.
    Replicate → Partial, or Shard(0) → Shard(0) when the routed experts take token shards (the
    shared experts then run on the shard with their weights replicated)."""

    output_layers = ("experts", "shared_experts.down_proj")

    def __init__(self, config: ModelConfig, parallel: ParallelLayout):
        super().__init__()
        self.gate = MoEGate(config.hidden_size, config.num_experts, correction_bias=config.topk_method == "noaux_tc")
        grouped = config.topk_method != "greedy"
        sharded = parallel.moe_tokens_sharded
        self.experts = FusedMoE(
            config.num_experts, config.num_experts_per_tok, config.hidden_size, config.moe_intermediate_size,
            renormalize=config.norm_topk_prob, scoring=config.scoring_func, parallel=parallel.moe,
            num_groups=config.n_group if grouped else None, topk_groups=config.topk_group if grouped else None,
            routed_scaling_factor=config.routed_scaling_factor, expert_parallel=parallel.expert_parallel,
            tokens_sharded=sharded)
        self.shared_experts = None
        if config.n_shared_experts:
            shared_parallel = ParallelContext() if sharded else parallel.dense
            self.shared_experts = LlamaMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts,
                                           False, shared_parallel)

    @property
    def input_placement(self):
        return self.experts.input_placement

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        y = self.experts(x, self.gate(x), self.gate.e_score_correction_bias)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y


class DeepseekDecoderLayer(LlamaDecoderLayer):
    """Pre-norm block (Llama's forward): MLA, then a dense MLP or DeepSeekMoE."""

    def __init__(self, config: ModelConfig, layer_idx: int, parallel: ParallelLayout,
                 rotary_emb: RotaryEmbedding, backend: MLABackend):
        nn.Module.__init__(self)
        self.self_attn = MLAAttention(config, layer_idx, parallel.attention, rotary_emb, backend)
        if config.is_moe_layer(layer_idx):
            self.mlp = DeepseekMoE(config, parallel)
        else:
            self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, False, parallel.dense)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DeepseekModel(LlamaModel):
    """Embedding, decoder layers, final norm (Llama's forward); one rope cache and one MLA kernel
    backend (selection, decode workspace, plan cache) shared by every layer."""

    def __init__(self, config: ModelConfig, parallel: ParallelLayout, layer_cls: type[DeepseekDecoderLayer]):
        nn.Module.__init__(self)
        mla = config.mla
        if mla is None:
            raise ValueError(f"model config {config.name!r}: {config.architecture} needs the MLA fields "
                             f"(kv_lora_rank, qk_rope_head_dim, ...)")
        self.tokens = StepTokens()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, parallel.attention)
        self.rotary_emb = RotaryEmbedding(mla.qk_rope_head_dim, config.max_position_embeddings, config.rope_theta,
                                          config.rope_scaling, is_neox=not mla.rope_interleave)
        heads = parallel.attention.divide(config.num_attention_heads, "attention heads")
        self.mla_backend = MLABackend(heads, mla_softmax_scale(mla.qk_head_dim, config.rope_scaling))
        self.layers = nn.ModuleList(layer_cls(config, i, parallel, self.rotary_emb, self.mla_backend)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


def mtp_layer_index(name: str) -> int | None:
    """Decoder-layer index of a checkpoint tensor name (`model.layers.{i}.…`), None for others."""
    match = _LAYER.match(name)
    return int(match.group(1)) if match else None


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    """Same interface as `LlamaForCausalLM`; the KV pool is an MLA pool (kv/mla_pool.py)."""

    model_cls = DeepseekModel
    layer_cls = DeepseekDecoderLayer
    stacked_params = DEEPSEEK_STACKED_PARAMS

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        num_layers = self.config.num_hidden_layers

        def main_model_only():  # layers past the last are MTP modules (DeepseekMTP loads them)
            for name, tensor in weights:
                layer = mtp_layer_index(name)
                if layer is None or layer < num_layers:
                    yield name, tensor

        loaded: set[str] = set()
        dense = route_expert_weights(dict(self.named_parameters()), main_model_only(), loaded)
        loaded |= load_stacked_weights(self, dense, self.stacked_params, self.config.tie_word_embeddings)
        return loaded


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    """DeepSeek-V3 / R1 and Kimi-K2: V2's architecture with sigmoid `noaux_tc` routing and q LoRA
    (the config decides; the class is the same)."""
