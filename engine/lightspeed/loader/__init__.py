"""Model loading: Hugging Face directories (safetensors), GGUF files (dequantised) and dummy weights."""

from .eagle3 import load_eagle3
from .files import LOAD_FORMATS, ModelFiles, resolve_model_files, weights_identity
from .loader import init_dummy_weights, load_hf_config, load_model, load_mtp, read_model_config

__all__ = [
    "LOAD_FORMATS",
    "ModelFiles",
    "init_dummy_weights",
    "load_eagle3",
    "load_hf_config",
    "load_model",
    "load_mtp",
    "read_model_config",
    "resolve_model_files",
    "weights_identity",
]
