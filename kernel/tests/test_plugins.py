"""A plugin package, installed as a dist-info on sys.path, wins in the PLUGIN band."""

import subprocess
import sys
import textwrap

PLUGIN_MODULE = '''
import torch
from lightspeed_kernel import Priority, register_kernel

LOADED = []


def register():
    LOADED.append(True)

    @register_kernel("norm", "rms", name="toy_rms", solution="toy", priority=Priority.PLUGIN + 1,
                     capability="any", dtypes=["float32", "bfloat16"])
    def toy_rms(x, weight, eps, *, out=None):
        return torch.full_like(x, 7.0)
'''

CHECK = '''
import sys
import torch
import lightspeed_kernel as lk
assert "toy_plugin" not in sys.modules, "plugins must load lazily"
sel = lk.select_kernel("norm", "rms", "float32", platform=lk.CPU)
import toy_plugin
assert sel.name == "toy_rms" and sel.spec.priority == lk.Priority.PLUGIN + 1, sel
assert lk.ops.rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6).eq(7).all()
lk.select_kernel("norm", "rms", "bfloat16", platform=lk.CPU)
lk.list_kernels()
assert toy_plugin.LOADED == [True], "loaded once"
assert any(p.name == "toy" and p.error is None for p in lk.REGISTRY.plugins())
# an fp16 input is not the plugin's: the built-in reference still serves it
assert lk.select_kernel("norm", "rms", "float16", platform=lk.CPU).name == "reference"
print("ok")
'''


def _install(tmp_path, module_text):
    (tmp_path / "toy_plugin.py").write_text(module_text)
    dist = tmp_path / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lightspeed_kernel.plugins]\ntoy = toy_plugin:register\n")


def _run(tmp_path, code, **env):
    import os

    environ = dict(os.environ, PYTHONPATH=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ)


def test_plugin_wins_in_plugin_band(tmp_path):
    _install(tmp_path, PLUGIN_MODULE)
    result = _run(tmp_path, CHECK)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_broken_plugin_is_isolated_and_disable_switch(tmp_path):
    _install(tmp_path, "raise RuntimeError('boom')\n")
    code = '''
    import warnings, lightspeed_kernel as lk
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert lk.select_kernel("norm", "rms", "float32", platform=lk.CPU).name == "reference"
    assert any("boom" in str(w.message) for w in caught)
    assert any(p.name == "toy" and "boom" in p.error for p in lk.REGISTRY.plugins())
    print("ok")
    '''
    result = _run(tmp_path, code)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    _install_ok = tmp_path / "ok"
    _install_ok.mkdir()
    _install(_install_ok, PLUGIN_MODULE)
    code = '''
    import lightspeed_kernel as lk
    assert lk.select_kernel("norm", "rms", "float32", platform=lk.CPU).name == "reference"
    print("ok")
    '''
    result = _run(_install_ok, code, LIGHTSPEED_KERNEL_DISABLE_PLUGINS="1")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
