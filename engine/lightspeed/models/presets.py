"""Built-in HF-style configs for `load_format="dummy"` (random weights, for benchmarks and tests).

The full-size entries copy the published `config.json` / `generation_config.json` facts of each
model; the `tiny-*` entries are small random-weight models for CPU tests.

Sources of the MLA entries (written from the published files, not fetched: no hub access here):
`deepseek-v3` = deepseek-ai/DeepSeek-V3 config.json (FP8 e4m3 with 128x128 blocks, as released);
`kimi-k2` = moonshotai/Kimi-K2-Instruct config.json (the DeepSeek-V3 architecture with 384 experts,
64 heads, one dense layer, no MTP module); `deepseek-v3-6l` = DeepSeek-V3's first 6 layers at full
width (3 dense + 3 MoE: 38.1B parameters, ~40 GB in FP8 with the embedding and LM head in bf16),
for single-GPU benchmarks.
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

_DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1,
                                            "mscale": 1.0, "mscale_all_dim": 1.0,
                                            "original_max_position_embeddings": 4096},
    "attention_bias": False, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}
PRESETS["deepseek-v3"] = _DEEPSEEK_V3
PRESETS["deepseek-v3-6l"] = {**_DEEPSEEK_V3, "num_hidden_layers": 6}
PRESETS["kimi-k2"] = {
    **_DEEPSEEK_V3, "model_type": "kimi_k2", "vocab_size": 163840, "num_attention_heads": 64,
    "num_key_value_heads": 64, "n_routed_experts": 384, "routed_scaling_factor": 2.827, "n_group": 1,
    "topk_group": 1, "first_k_dense_replace": 1, "max_position_embeddings": 131072, "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 32.0, "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    "num_nextn_predict_layers": 0, "bos_token_id": 163584, "eos_token_id": 163585,
}

_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
_TINY_MLA = {k: v for k, v in _TINY.items() if k != "head_dim"}  # MLA head dims are their own fields
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
    # MLA needs the kernels' 512-wide latent and 64-wide rope key; sizes of fused FP8 linears are
    # multiples of the 128 block, so `--quantization fp8` runs on it too. Layer 0 is dense.
    "tiny-deepseek-v3": {**_TINY_MLA, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                         "num_hidden_layers": 3, "num_key_value_heads": 4, "intermediate_size": 256,
                         "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
                         "n_shared_experts": 1, "routed_scaling_factor": 2.5, "topk_method": "noaux_tc",
                         "scoring_func": "sigmoid", "n_group": 4, "topk_group": 2, "norm_topk_prob": True,
                         "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": 32,
                         "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
                         "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1,
                                          "mscale": 1.0, "mscale_all_dim": 1.0,
                                          "original_max_position_embeddings": 128},
                         "tie_word_embeddings": False, "num_nextn_predict_layers": 1},
    # DeepSeek-V2-Lite's shape in small: no q LoRA, softmax routing over limited groups, no bias.
    "tiny-deepseek-v2": {**_TINY_MLA, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                         "num_hidden_layers": 2, "num_key_value_heads": 4, "intermediate_size": 256,
                         "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2,
                         "n_shared_experts": 2, "routed_scaling_factor": 1.5,
                         "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                         "norm_topk_prob": False, "first_k_dense_replace": 1, "kv_lora_rank": 512,
                         "q_lora_rank": None, "qk_nope_head_dim": 32, "qk_rope_head_dim": 64, "v_head_dim": 32,
                         "tie_word_embeddings": False},
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
