"""Kernel test fixtures: registry isolation for tests that register kernels or change env."""

from __future__ import annotations

import os

import pytest
import torch

# Triton turns @triton.jit functions into interpreted ones only if TRITON_INTERPRET is set when they
# are decorated, i.e. before `import lightspeed_kernel` (which imports the Triton kernels); on a
# machine without a GPU that is the only way they run (kernel/tests/triton).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import lightspeed_kernel as lk  # noqa: E402


@pytest.fixture
def registry_sandbox(monkeypatch):
    """Kernels registered inside the test are removed afterwards; env changes are re-read."""
    before = {key: dict(table) for key, table in lk.REGISTRY._specs.items()}
    yield lk.REGISTRY
    for key in list(lk.REGISTRY._specs):
        lk.REGISTRY._specs[key] = before.get(key, {})
        if not lk.REGISTRY._specs[key]:
            del lk.REGISTRY._specs[key]
    monkeypatch.undo()
    lk.refresh()
