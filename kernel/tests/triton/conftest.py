"""Triton tests: on a machine without CUDA the kernels run under the Triton interpreter.

TRITON_INTERPRET must be set before the kernels are decorated, that is before the first
`import lightspeed_kernel`: kernel/tests/conftest.py (loaded before this file) sets it.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton")


@pytest.fixture
def device() -> str:
    """Device of the small-size grid: CUDA when present, else CPU through the interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"
