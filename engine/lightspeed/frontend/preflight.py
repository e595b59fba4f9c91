"""Start-up checks in the caller's process, before the engine core process starts.

A wrong model argument or device then fails in a fraction of a second with one clear ValueError,
instead of a traceback from the core seconds later (or a tokenizer error that hides the cause:
a folder without weights used to fail first in transformers, while loading its tokenizer).
"""

from __future__ import annotations

from typing import Any


def check_engine_config(config: Any) -> None:
    """ValueError naming the problem when the model files or the device cannot be used."""
    from ..loader.files import resolve_model_files
    from ..runner.factory import resolve_device

    load_format = "hf" if config.load_format == "safetensors" else config.load_format
    resolve_model_files(config.model, load_format)
    resolve_device(config.device)
