"""DeepSeek-V2/V3 and Kimi-K2 configs: the presets have the published shapes (parameter counts equal
transformers' for the same config), and configs the kernels cannot run are rejected at load with
an error naming the config field."""

from __future__ import annotations

import json

import pytest
import torch
from lightspeed.loader import load_model
from lightspeed.models import ModelConfig, build_model, preset_config, preset_hf_config


def _transformers_params(hf: dict) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = {k: v for k, v in hf.items() if k not in ("architectures", "quantization_config")}
    model_type = hf.pop("model_type")
    config = AutoConfig.for_model("deepseek_v3" if model_type == "kimi_k2" else model_type, **hf)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    # DeepSeek-V3's routing bias is a buffer there, a parameter here.
    return sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))


@pytest.mark.parametrize("name, billions", [("deepseek-v3", 671.0), ("kimi-k2", 1026.4),
                                            ("deepseek-v3-6l", 38.1), ("tiny-deepseek-v3", None),
                                            ("tiny-deepseek-v2", None)])
def test_presets_match_transformers_shapes(name, billions):
    config = preset_config(name)
    with torch.device("meta"):
        ours = sum(p.numel() for p in build_model(config).parameters())
    assert ours == _transformers_params(preset_hf_config(name))
    if billions is not None:
        assert round(ours / 1e9, 1) == billions
    assert config.mla.kv_lora_rank == 512 and config.mla.qk_rope_head_dim == 64


def test_published_facts():
    v3, kimi = preset_config("deepseek-v3"), preset_config("kimi-k2")
    assert v3.quantization.weight_block_size == (128, 128) and kimi.quantization is not None
    assert (v3.topk_method, v3.scoring_func, v3.n_group, v3.topk_group) == ("noaux_tc", "sigmoid", 8, 4)
    assert v3.mlp_only_layers == (0, 1, 2) and kimi.mlp_only_layers == (0,)
    assert (kimi.num_experts, kimi.num_attention_heads, kimi.routed_scaling_factor) == (384, 64, 2.827)
    assert v3.num_nextn_predict_layers == 1 and kimi.num_nextn_predict_layers == 0
    assert kimi.architecture == "DeepseekV3ForCausalLM" and kimi.model_type == "kimi_k2"
    v2 = preset_config("tiny-deepseek-v2")
    assert v2.mla.q_lora_rank is None and v2.scoring_func == "softmax" and not v2.norm_topk_prob


@pytest.mark.parametrize("change, field", [
    ({"topk_method": "sinkhorn"}, "topk_method='sinkhorn'"),
    ({"scoring_func": "relu"}, "scoring_func='relu'"),
    ({"kv_lora_rank": 256}, "kv_lora_rank=256"),
    ({"qk_rope_head_dim": 32}, "qk_rope_head_dim=32"),
    ({"moe_layer_freq": 2}, "moe_layer_freq=2"),
    ({"n_group": 3}, "n_group=3"),
    ({"topk_group": 9}, "topk_group=9"),
    ({"v_head_dim": 0}, "v_head_dim"),
    ({"topk_method": "noaux_tc", "scoring_func": "softmax"}, "needs scoring_func='sigmoid'"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [64, 64]}},
     r"quantization_config.weight_block_size=\[64, 64\]"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": None}}, "weight_block_size=None"),
    ({"quantization_config": {"quant_method": "awq"}}, "quant_method='awq'"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}},
     "fmt='e5m2'"),
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                              "activation_scheme": "static"}}, "activation_scheme='static'"),
])
def test_unrunnable_config_rejected_at_load_naming_the_field(tmp_path, change, field):
    hf = {**preset_hf_config("tiny-deepseek-v3"), **change}
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf_dict(hf)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=field):
        load_model(str(tmp_path), load_format="dummy", progress=False)


def test_fp8_checkpoint_needs_whole_blocks_in_fused_shards(tmp_path):
    hf = {**preset_hf_config("tiny-deepseek-v3"), "moe_intermediate_size": 96,
          "quantization_config": preset_hf_config("deepseek-v3")["quantization_config"]}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        load_model(str(tmp_path), load_format="dummy", progress=False)
