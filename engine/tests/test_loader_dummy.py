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


def test_uniform_dummy_weights_are_vllms_draw():
    """--dummy-weights uniform: every weight, norms included, in U(-1e-3, 1e-3), as vLLM's dummy loader."""
    model, _ = load_model("tiny-qwen2", load_format="dummy", dummy_weights="uniform", seed=3, progress=False)
    again, _ = load_model("tiny-qwen2", load_format="dummy", dummy_weights="uniform", seed=3, progress=False)
    for (name, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q), name
        assert p.abs().max() <= 1e-3 and p.abs().max() > 5e-4, name  # spread over the whole range
    assert not torch.all(model.model.norm.weight == 1)
    with pytest.raises(ValueError, match="normal, uniform"):
        load_model("tiny-qwen2", load_format="dummy", dummy_weights="zeros", progress=False)


def test_uniform_dummy_fp8_weights_have_the_same_effective_range():
    model, _ = load_model("tiny-qwen2", load_format="dummy", dummy_weights="uniform", quantization="fp8",
                          progress=False)
    fp8 = [(n, m) for n, m in model.named_modules() if getattr(m, "weight", None) is not None
           and m.weight.dtype == torch.float8_e4m3fn]
    assert fp8
    for name, module in fp8:
        scale = module.weight_scale_inv
        effective = module.weight.float().abs().max() * scale.max()
        assert 5e-4 < effective <= 1e-3 + 1e-9, name
