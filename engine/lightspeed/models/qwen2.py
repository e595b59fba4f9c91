"""Qwen2 / Qwen2.5: the Llama block with biases on q/k/v (none on the output projection)."""

from __future__ import annotations

from .llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM


class Qwen2Attention(LlamaAttention):
    """q/k/v projections carry a bias (`ModelConfig.attention_bias` is set for qwen2); o_proj does not."""

    o_proj_bias = False


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Same interface and checkpoint names as `LlamaForCausalLM`."""

    layer_cls = Qwen2DecoderLayer
