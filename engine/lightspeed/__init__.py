"""Lightspeed: an LLM inference engine.

Public API (see engine/README.md): LLM, AsyncLLM, SamplingParams, StructuredOutputParams,
RequestOutput, CompletionOutput, Logprob, RequestOutputKind, EngineConfig, engine_arg_specs,
EngineDeadError, RequestFailedError, default_model, load_tokenizer, apply_chat_template, data_parallel_configs,
run_node, __version__.

Names are imported lazily, so `import lightspeed.runner` (e.g. on a GPU box driving the runner
in-process) does not pull in the ZMQ client stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "LLM": "lightspeed.api.llm",
    "AsyncLLM": "lightspeed.api.async_llm",
    "SamplingParams": "lightspeed.api.sampling_params",
    "StructuredOutputParams": "lightspeed.api.sampling_params",
    "RequestOutputKind": "lightspeed.api.sampling_params",
    "RequestOutput": "lightspeed.api.outputs",
    "CompletionOutput": "lightspeed.api.outputs",
    "Logprob": "lightspeed.api.outputs",
    "EngineConfig": "lightspeed.config",
    "engine_arg_specs": "lightspeed.config",
    "EngineDeadError": "lightspeed.core.errors",
    "RequestFailedError": "lightspeed.core.errors",
    "default_model": "lightspeed.model_files",
    "load_tokenizer": "lightspeed.frontend.tokenizer",
    "import_tokenizer_libraries": "lightspeed.frontend.tokenizer",
    "apply_chat_template": "lightspeed.frontend.tokenizer",
    "data_parallel_configs": "lightspeed.distributed.topology",
    "run_node": "lightspeed.distributed.node",
}

__all__ = [
    "LLM", "AsyncLLM", "SamplingParams", "StructuredOutputParams", "RequestOutputKind", "RequestOutput",
    "CompletionOutput", "Logprob", "EngineConfig", "engine_arg_specs", "EngineDeadError", "RequestFailedError",
    "default_model", "load_tokenizer", "import_tokenizer_libraries", "apply_chat_template", "data_parallel_configs",
    "run_node", "__version__",
]
assert set(__all__) == {*_EXPORTS, "__version__"}

if TYPE_CHECKING:
    from .api.async_llm import AsyncLLM
    from .api.llm import LLM
    from .api.outputs import CompletionOutput, Logprob, RequestOutput
    from .api.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputParams
    from .config import EngineConfig, engine_arg_specs
    from .core.errors import EngineDeadError, RequestFailedError
    from .distributed.node import run_node
    from .distributed.topology import data_parallel_configs
    from .frontend.tokenizer import apply_chat_template, import_tokenizer_libraries, load_tokenizer
    from .model_files import default_model


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightspeed' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
