"""ModelConfig parsing (transformers 4 and 5 spellings), presets, and the model registry."""

from __future__ import annotations

import pytest
import torch
from lightspeed.models import (
    ModelConfig,
    build_model,
    get_model_class,
    preset_config,
    preset_hf_config,
    supported_architectures,
)

# Published parameter counts of the full-size presets (embeddings included, tied ones once).
PARAMS = {"llama-3.1-8b": 8_030_261_248, "llama-3.2-1b": 1_235_814_400, "qwen3-8b": 8_190_735_360,
          "qwen3-30b-a3b": 30_532_122_624, "smollm2-135m": 134_515_008}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_full_size_presets_have_the_published_shapes(name):
    config = preset_config(name)
    with torch.device("meta"):  # shapes only, no memory
        model = build_model(config)
    assert sum(p.numel() for p in model.parameters()) == PARAMS[name]
    assert type(model).__name__ == config.architecture and config.torch_dtype == torch.bfloat16


def test_transformers4_and_5_spellings_agree():
    v5 = preset_hf_config("llama-3.1-8b")
    scaling = v5.pop("rope_scaling")
    v5["rope_parameters"] = {**scaling, "rope_theta": v5.pop("rope_theta")}
    v5["dtype"] = v5.pop("torch_dtype")
    v4 = preset_hf_config("llama-3.1-8b")
    v4["rope_scaling"] = {**{k: v for k, v in v4["rope_scaling"].items() if k != "rope_type"}, "type": "llama3"}
    a, b = ModelConfig.from_hf_dict(v4), ModelConfig.from_hf_dict(v5)
    assert a == b and a.rope_scaling == b.rope_scaling
    assert a.rope_theta == 500000.0 and a.rope_scaling["rope_type"] == "llama3"
    assert a.eos_token_ids == (128001, 128008, 128009) and a.head_dim == 128


def test_defaults_and_moe_fields():
    hf = preset_hf_config("qwen3-30b-a3b")
    hf["num_local_experts"] = hf.pop("num_experts")  # transformers 5 name
    config = ModelConfig.from_hf_dict(hf)
    assert config.num_experts == 128 and config.num_experts_per_tok == 8 and config.moe_intermediate_size == 768
    assert config.is_moe_layer(0) and config.num_kv_heads_per_rank(8) == 1
    qwen2 = ModelConfig.from_hf_dict({**preset_hf_config("tiny-qwen2"), "architectures": None})
    assert qwen2.architecture == "Qwen2ForCausalLM" and qwen2.attention_bias  # from model_type
    plain = ModelConfig.from_hf_dict({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
                                      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2})
    assert plain.num_key_value_heads == 2 and plain.head_dim == 4 and plain.rope_scaling is None


@pytest.mark.parametrize("change, message", [
    ({"num_key_value_heads": 3}, "not a multiple"),
    ({"hidden_act": "gelu"}, "gelu"),
    ({"hidden_size": 0}, "hidden_size"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"torch_dtype": "float99"}, "float99"),
])
def test_invalid_configs_are_clear_errors(change, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_dict({**preset_hf_config("tiny-qwen3"), **change})
    hf = preset_hf_config("tiny-qwen3")
    del hf["vocab_size"]
    with pytest.raises(ValueError, match="vocab_size"):
        ModelConfig.from_hf_dict(hf)


def test_registry():
    assert supported_architectures() == ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "LlamaForCausalLM",
                                         "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]
    assert get_model_class("Qwen3MoeForCausalLM").__name__ == "Qwen3MoeForCausalLM"
    with pytest.raises(ValueError, match="'MistralForCausalLM'.*supported: .*LlamaForCausalLM, Qwen2ForCausalLM"):
        get_model_class("MistralForCausalLM")
