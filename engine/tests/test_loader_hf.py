"""Hugging Face directory loading: sharded safetensors with an index, dtype handling,
generation_config.json EOS ids, and clear errors for bad, truncated or incomplete checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest_models import hf_reference_model
from lightspeed.loader import load_hf_config, load_model, resolve_model_files
from safetensors.torch import save_file


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """tiny-qwen3 saved in bfloat16, sharded into several files with an index."""
    path = tmp_path_factory.mktemp("hf_sharded")
    hf = hf_reference_model("tiny-qwen3", seed=3).to(torch.bfloat16)
    hf.save_pretrained(path, max_shard_size="40KB")
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "bos_token_id": 1}))
    return path, hf


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_sharded_index_and_dtype(hf_dir):
    path, hf = hf_dir
    files = resolve_model_files(path)
    assert files.load_format == "hf" and len(files.weight_files) > 1
    assert (path / "model.safetensors.index.json").is_file()
    model, config = load_model(path, progress=False)  # dtype auto = the checkpoint's bfloat16
    assert config.torch_dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    reference = hf.state_dict()["model.layers.1.self_attn.q_norm.weight"]
    assert torch.equal(model.model.layers[1].self_attn.q_norm.weight, reference)
    assert config.eos_token_ids == (2, 7)  # generation_config.json wins over config.json


def test_without_index(tmp_path):
    hf = hf_reference_model("tiny-llama", seed=4)
    hf.save_pretrained(tmp_path)
    assert not (tmp_path / "model.safetensors.index.json").exists()
    model, config = load_model(tmp_path, dtype="float32", progress=False)
    assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)
    assert load_hf_config(tmp_path) == config.__class__.from_pretrained(tmp_path)


def test_truncated_safetensors_names_the_file(hf_dir, tmp_path):
    path = _copy(hf_dir[0], tmp_path / "m")
    victim = sorted(path.glob("*.safetensors"))[-1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size - 100])
    with pytest.raises(ValueError, match=f"{victim.name}.*truncated"):
        load_model(path, progress=False)


def test_garbage_safetensors_names_the_file(hf_dir, tmp_path):
    path = _copy(hf_dir[0], tmp_path / "m")
    victim = sorted(path.glob("*.safetensors"))[0]
    victim.write_bytes(b"\x00" * 7)
    with pytest.raises(ValueError, match=victim.name):
        load_model(path, progress=False)


def test_missing_shard_and_missing_weight(hf_dir, tmp_path):
    path = _copy(hf_dir[0], tmp_path / "m")
    shard = sorted(path.glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(ValueError, match=f"missing weight files: {shard.name}"):
        load_model(path, progress=False)
    # A checkpoint lacking a tensor (no index, one file without the final norm).
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(hf_dir[0] / "config.json", single)
    state = {k: v.contiguous() for k, v in hf_dir[1].state_dict().items() if k != "model.norm.weight"}
    save_file(state, str(single / "model.safetensors"))
    with pytest.raises(ValueError, match="lacks weights for model.norm.weight"):
        load_model(single, progress=False)


def test_unexpected_tensor_and_architecture(hf_dir, tmp_path):
    path = tmp_path / "m"
    path.mkdir()
    config = json.loads((hf_dir[0] / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config))
    save_file({"model.layers.0.mystery.weight": torch.zeros(2)}, str(path / "model.safetensors"))
    with pytest.raises(ValueError, match="mystery"):
        load_model(path, progress=False)
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM.*Qwen3MoeForCausalLM"):
        load_model(path, progress=False)


def test_bad_paths_and_formats(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_model(tmp_path / "nowhere", progress=False)
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path, progress=False)
    with pytest.raises(ValueError, match="load_format"):
        load_model(tmp_path, load_format="pickle", progress=False)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        load_hf_config(tmp_path)
