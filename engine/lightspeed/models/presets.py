"""Built-in HF-style configs for `load_format="dummy"` (random weights, for benchmarks and tests).

The full-size entries copy the published `config.json` / `generation_config.json` facts of each
model; the `tiny-*` entries are small random-weight models for CPU tests.
"""

from __future__ import annotations

import copy
from typing import Any

from .config import ModelConfig

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}, "tie_word_embeddings": False,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
    },
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}, "tie_word_embeddings": True,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
    },
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": [151645, 151643],
        "torch_dtype": "bfloat16",
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": [151645, 151643],
        "torch_dtype": "bfloat16",
    },
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
    },
}

_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
PRESETS.update({
    "tiny-llama": {**_TINY, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "tie_word_embeddings": True,
                   "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0, "original_max_position_embeddings": 64}},
    "tiny-qwen2": {**_TINY, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "tie_word_embeddings": False},
    "tiny-qwen3": {**_TINY, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                   "tie_word_embeddings": False},
    "tiny-qwen3-moe": {**_TINY, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                       "tie_word_embeddings": False, "num_experts": 8, "num_experts_per_tok": 2,
                       "moe_intermediate_size": 32, "norm_topk_prob": True, "decoder_sparse_step": 1,
                       "mlp_only_layers": [1]},
})


def preset_names() -> list[str]:
    return sorted(PRESETS)


def preset_hf_config(name: str) -> dict[str, Any]:
    """A copy of the preset's HF-style config dict (ValueError naming the presets if unknown)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(preset_names())}")
    return copy.deepcopy(PRESETS[name])


def preset_config(name: str) -> ModelConfig:
    """The preset as a `ModelConfig`."""
    return ModelConfig.from_hf_dict(preset_hf_config(name), name=name)
