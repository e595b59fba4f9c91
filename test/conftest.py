"""End-to-end fixtures: the default model (SmolLM2-135M-Instruct GGUF) and its transformers twin."""

import pytest


@pytest.fixture(scope="session")
def smollm2_path():
    from lightspeed import default_model

    try:
        return default_model()
    except RuntimeError as e:
        pytest.skip(str(e))


def load_transformers_gguf(path: str):
    """transformers' LlamaForCausalLM from a GGUF file through transformers' own GGUF reader
    (dequantise + un-permute), fp32: an implementation independent of Lightspeed's loader.
    (`from_pretrained(gguf_file=...)` would do the same but insists on `accelerate`.)"""
    from pathlib import Path

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    torch.set_num_threads(1)  # the engine core runs beside us: two busy processes on two cores
    p = Path(path)
    config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(p), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model.eval()


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """transformers' model on the same GGUF file as the engine."""
    return load_transformers_gguf(smollm2_path)
