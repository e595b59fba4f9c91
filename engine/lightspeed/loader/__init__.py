"""Model loading: Hugging Face directories (safetensors), GGUF files (dequantised) and dummy weights."""

from .files import LOAD_FORMATS, ModelFiles, resolve_model_files, weights_identity
from .loader import init_dummy_weights, load_hf_config, load_model, load_mtp

__all__ = [
    "LOAD_FORMATS",
    "ModelFiles",
    "init_dummy_weights",
    "load_hf_config",
    "load_model",
    "load_mtp",
    "resolve_model_files",
    "weights_identity",
]
