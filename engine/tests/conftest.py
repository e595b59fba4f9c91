"""Engine test fixtures: the default model's path (SmolLM2 GGUF) and a tiny random Llama."""

import json

import pytest


@pytest.fixture(scope="session")
def default_model_path():
    from lightspeed import default_model

    try:
        return default_model()
    except RuntimeError as e:
        pytest.skip(str(e))


TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """config.json of a tiny random Llama with SmolLM2's vocabulary (load_format="dummy")."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(folder)
