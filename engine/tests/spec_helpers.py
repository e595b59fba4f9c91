"""Helpers for the speculative-decoding tests: a random EAGLE-3 head folder for a target model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_random_eagle3_head(folder: Path, target_config, *, draft_vocab_size: int = 1024, seed: int = 0,
                             vocab_size: int | None = None) -> Path:
    """An EAGLE-3 checkpoint (config.json + model.safetensors, the Hub's names) with random weights
    for a Llama-family target: the draft vocabulary is every `vocab / draft_vocab`-th token."""
    c = target_config
    vocab = vocab_size or c.vocab_size
    h, d = c.hidden_size, c.head_dim
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
              "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
              "head_dim": d, "intermediate_size": 2 * h, "vocab_size": vocab, "draft_vocab_size": draft_vocab_size,
              "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
              "max_position_embeddings": c.max_position_embeddings, "num_hidden_layers": 1}
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.02

    qh, kvh, inter = c.num_attention_heads * d, c.num_key_value_heads * d, 2 * h
    draft_ids = torch.arange(draft_vocab_size) * (vocab // draft_vocab_size)
    tensors = {
        "fc.weight": rand(h, 3 * h),
        "midlayer.self_attn.q_proj.weight": rand(qh, 2 * h), "midlayer.self_attn.k_proj.weight": rand(kvh, 2 * h),
        "midlayer.self_attn.v_proj.weight": rand(kvh, 2 * h), "midlayer.self_attn.o_proj.weight": rand(h, qh),
        "midlayer.mlp.gate_proj.weight": rand(inter, h), "midlayer.mlp.up_proj.weight": rand(inter, h),
        "midlayer.mlp.down_proj.weight": rand(h, inter),
        "midlayer.input_layernorm.weight": torch.ones(h), "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h), "norm.weight": torch.ones(h),
        "lm_head.weight": rand(draft_vocab_size, h),
        "d2t": draft_ids - torch.arange(draft_vocab_size), "t2d": torch.zeros(vocab, dtype=torch.bool),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder
