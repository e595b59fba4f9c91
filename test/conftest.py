"""End-to-end fixtures: the default model (SmolLM2-135M-Instruct GGUF) and its transformers twin."""

import pytest


@pytest.fixture(scope="session")
def smollm2_path():
    from lightspeed import default_model

    try:
        return default_model()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path):
    """transformers' LlamaForCausalLM on the same GGUF file (dequantised to fp32)."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    path = Path(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()
