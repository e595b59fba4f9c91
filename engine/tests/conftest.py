"""Engine test fixtures: the default model's path (SmolLM2 GGUF) and a tiny random Llama."""

import json

import pytest
from conftest_models import TINY_LLAMA


@pytest.fixture(scope="session")
def default_model_path():
    from lightspeed import default_model

    try:
        return default_model()
    except RuntimeError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """config.json of a tiny random Llama with SmolLM2's vocabulary (load_format="dummy")."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(folder)
