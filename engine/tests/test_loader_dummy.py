"""Dummy loading: random weights from a preset name or a config.json, deterministic per seed."""

from __future__ import annotations

import json

import pytest
import torch
from lightspeed.loader import load_model
from lightspeed.models import preset_hf_config, preset_names


def test_preset_is_deterministic_per_seed():
    a, config = load_model("tiny-qwen3-moe", load_format="dummy", seed=1, progress=False)
    b, _ = load_model("tiny-qwen3-moe", load_format="dummy", seed=1, progress=False)
    c, _ = load_model("tiny-qwen3-moe", load_format="dummy", seed=2, progress=False)
    assert config.is_moe and config.torch_dtype == torch.float32
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(p, r), name
    assert torch.all(a.model.norm.weight == 1)


def test_from_config_json_with_dtype(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(preset_hf_config("tiny-qwen2")))
    for target in (tmp_path, tmp_path / "config.json"):
        model, config = load_model(str(target), load_format="dummy", dtype="bfloat16", progress=False)
        assert config.architecture == "Qwen2ForCausalLM" and config.torch_dtype == torch.bfloat16
        assert model.model.layers[0].self_attn.qkv_proj.bias.dtype == torch.bfloat16


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match="llama-3.1-8b.*qwen3-30b-a3b"):
        load_model("llama-9", load_format="dummy", progress=False)
    assert {"llama-3.1-8b", "llama-3.2-1b", "qwen3-8b", "qwen3-30b-a3b", "smollm2-135m"} <= set(preset_names())
