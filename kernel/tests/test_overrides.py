import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import CPU, KernelSelectionError, Priority, override, register_kernel, select_kernel


@pytest.fixture
def kernels(registry_sandbox):
    for name, priority in (
        ("best", Priority.PERFORMANT),
        ("a", Priority.PORTABLE),
        ("b", Priority.PORTABLE + 1),
    ):
        register_kernel("t_ovr", "dec", name=name, solution="test", priority=priority)(lambda name=name: name)
    register_kernel("t_ovr", "dec", name="gpu", solution="test", priority=0, capability="cuda")(lambda: "gpu")
    return registry_sandbox


def _pick(**kw):
    return select_kernel("t_ovr", "dec", "float32", platform=CPU, **kw).name


def test_no_override_ranks(kernels):
    assert _pick() == "best"


def test_precedence_argument_context_env_config(kernels, monkeypatch, tmp_path):
    config = tmp_path / "kernels.toml"
    config.write_text('[overrides]\n"t_ovr/dec" = "a"\n')
    monkeypatch.setenv("LIGHTSPEED_KERNEL_CONFIG", str(config))
    lk.refresh()
    assert _pick() == "a"
    monkeypatch.setenv("LIGHTSPEED_KERNEL_OVERRIDE_T_OVR_DEC", "b")
    lk.refresh()
    assert _pick() == "b"
    with override(**{"t_ovr/dec": "best"}):
        assert _pick() == "best"
        assert _pick(override="a") == "a"
        explanation = lk.explain("t_ovr", "dec", platform=CPU)
        assert explanation.override == ("best", "context") and explanation.selected == "best"
    assert _pick() == "b"


def test_nested_context_inner_wins_and_restores(kernels):
    with override({"t_ovr/dec": "a"}):
        with override(**{"t_ovr/dec": "b"}):
            assert _pick() == "b"
        assert _pick() == "a"
    assert _pick() == "best"


def test_config_nested_table(kernels, monkeypatch, tmp_path):
    config = tmp_path / "kernels.toml"
    config.write_text('[overrides.t_ovr]\ndec = "b"\n')
    monkeypatch.setenv("LIGHTSPEED_KERNEL_CONFIG", str(config))
    lk.refresh()
    assert _pick() == "b"


def test_unknown_override_lists_runnable(kernels):
    with pytest.raises(KernelSelectionError) as err:
        _pick(override="nope")
    message = str(err.value)
    assert "'nope'" in message and "can run: best, b, a" in message


def test_unrunnable_override_says_why(kernels):
    with override(**{"t_ovr/dec": "gpu"}), pytest.raises(KernelSelectionError) as err:
        _pick()
    assert "from context" in str(err.value) and "needs device cuda" in str(err.value)
    assert "can run: best, b, a" in str(err.value)


def test_bad_key_rejected():
    with pytest.raises(ValueError, match="family/mode"), override(attention_decode="x"):
        pass


def test_override_reaches_ops(registry_sandbox):
    seen = []

    @register_kernel("norm", "rms", name="t_marker", solution="test", priority=0)
    def marker(x, weight, eps, *, out=None):
        seen.append(True)
        return x

    x = torch.randn(3, 8)
    lk.ops.rms_norm(x, torch.ones(8), 1e-6)
    assert seen == []
    with override(**{"norm/rms": "t_marker"}):
        assert lk.ops.rms_norm(x, torch.ones(8), 1e-6) is x
    assert seen == [True]
    lk.ops.rms_norm(x, torch.ones(8), 1e-6)
    assert seen == [True]


def test_launchers_read_the_interpreter_flag_from_the_snapshot(monkeypatch):
    from lightspeed_kernel.env import kernel_env

    interpreting = pytest.importorskip("lightspeed_kernel.triton._common").interpreting
    before = interpreting()
    assert before == kernel_env().triton_interpret
    monkeypatch.setenv("TRITON_INTERPRET", "0" if before else "1")
    assert interpreting() == before, "read once, not per launch"
    lk.refresh()
    assert interpreting() != before
    monkeypatch.undo()
    lk.refresh()
    assert interpreting() == before
