"""Model classes keyed by the HF `architectures` name."""

from __future__ import annotations

import importlib

from torch import nn

from ..layers import ParallelContext, ParallelLayout, compile_placements
from .config import ModelConfig

# architecture -> (module in lightspeed.models, class name); imported on first use.
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def get_model_class(architecture: str) -> type[nn.Module]:
    """The model class for a HF architecture name; ValueError naming the supported ones otherwise."""
    if architecture not in _MODELS:
        raise ValueError(f"unsupported model architecture {architecture!r}; "
                         f"supported: {', '.join(supported_architectures())}")
    module_name, class_name = _MODELS[architecture]
    module = importlib.import_module(f"{__package__}.{module_name}")
    return getattr(module, class_name)


def build_model(config: ModelConfig, parallel: ParallelLayout | ParallelContext | None = None) -> nn.Module:
    """Instantiate (uninitialised weights, default dtype and device) the model for `config`, laid
    out over `parallel`'s groups with the collectives the placement compiler inserts."""
    layout = ParallelLayout.of(parallel)
    model = get_model_class(config.architecture)(config, layout)
    compile_placements(model, layout)
    return model
