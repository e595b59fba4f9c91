"""Kernel test fixtures: registry isolation for tests that register kernels or change env."""

from __future__ import annotations

import pytest

import lightspeed_kernel as lk


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
