"""Model architectures (plain `nn.Module`s over `lightspeed_kernel.ops`), their config and registry."""

from .config import ModelConfig
from .presets import preset_config, preset_hf_config, preset_names
from .registry import build_model, get_model_class, supported_architectures

__all__ = [
    "ModelConfig",
    "build_model",
    "get_model_class",
    "preset_config",
    "preset_hf_config",
    "preset_names",
    "supported_architectures",
]
