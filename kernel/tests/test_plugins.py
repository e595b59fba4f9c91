"""A plugin package, installed as a dist-info on sys.path, wins in the PLUGIN band."""

import sys
import warnings

import lightspeed_kernel as lk
import pytest
import torch

PLUGIN_MODULE = """
import torch
from lightspeed_kernel import Priority, register_kernel

LOADED = []


def register():
    LOADED.append(True)

    @register_kernel("norm", "rms", name="toy_rms", solution="toy", priority=Priority.PLUGIN + 1,
                     capability="any", dtypes=["float32", "bfloat16"])
    def toy_rms(x, weight, eps, *, out=None):
        return torch.full_like(x, 7.0)
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch, registry_sandbox):
    """An importable directory with a ``toy-plugin`` distribution; plugins reload lazily."""

    def install(module_text):
        (tmp_path / "toy_plugin.py").write_text(module_text)
        dist = tmp_path / "toy_plugin-0.1.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text("[lightspeed_kernel.plugins]\ntoy = toy_plugin:register\n")

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_plugin", raising=False)
    loaded_before = registry_sandbox._plugins
    registry_sandbox._plugins = None  # as in a fresh process: nothing loaded yet
    yield install
    sys.modules.pop("toy_plugin", None)
    registry_sandbox._plugins = loaded_before


def _select(dtype="float32"):
    return lk.select_kernel("norm", "rms", dtype, platform=lk.CPU)


def _builtin(selected) -> bool:
    """Served by a built-in kernel (the reference, or the native CPU one where it is registered)."""
    return selected.spec.solution in ("reference", "native")


def test_plugin_wins_in_plugin_band(plugin_dir):
    plugin_dir(PLUGIN_MODULE)
    assert "toy_plugin" not in sys.modules  # lazily: nothing loaded before the first selection
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # other installed plugins may be half-written
        selected = _select()
    plugin = sys.modules["toy_plugin"]
    assert selected.name == "toy_rms" and selected.spec.priority == lk.Priority.PLUGIN + 1
    assert lk.ops.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6).eq(7).all()
    _select("bfloat16")
    lk.list_kernels()
    lk.explain("norm", "rms", "float32")
    assert plugin.LOADED == [True]  # loaded once
    assert any(p.name == "toy" and p.error is None for p in lk.REGISTRY.plugins())
    assert _builtin(_select("float16"))  # not the plugin's dtype: a built-in serves it


def test_broken_plugin_is_isolated(plugin_dir):
    plugin_dir("raise RuntimeError('boom')\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _builtin(_select())
    assert any("boom" in str(w.message) for w in caught)
    assert any(p.name == "toy" and "boom" in p.error for p in lk.REGISTRY.plugins())


def test_disable_switch(plugin_dir, monkeypatch):
    plugin_dir(PLUGIN_MODULE)
    monkeypatch.setenv("LIGHTSPEED_KERNEL_DISABLE_PLUGINS", "1")
    lk.refresh()
    assert _builtin(_select())
    assert "toy_plugin" not in sys.modules and lk.REGISTRY.plugins() == []
