"""Environment variables (lightspeed/envs.py): read once, defaults, and a clear error for a bad value."""

import pytest
from lightspeed import envs


def _load(monkeypatch, name: str, raw: str | None) -> envs.Envs:
    if raw is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, raw)
    return envs.load_envs()


@pytest.mark.parametrize("raw,want", [("kernel", "kernel"), ("STREAM", "stream"), ("compute", "compute"),
                                      ("", "kernel"), (None, "kernel")])
def test_step_io_variable(monkeypatch, raw, want):
    assert _load(monkeypatch, "LIGHTSPEED_STEP_IO", raw).step_io == want


@pytest.mark.parametrize("raw,want", [(None, 512), ("", 512), ("2048", 2048)])
def test_write_through_variable(monkeypatch, raw, want):
    assert _load(monkeypatch, "LIGHTSPEED_WRITE_THROUGH_MIB", raw).write_through_mib == want


@pytest.mark.parametrize("raw,message", [("0", "must be >= 1"), ("lots", "is not an integer")])
def test_a_bad_write_through_variable_is_a_clear_error(monkeypatch, raw, message):
    with pytest.raises(ValueError, match=f"LIGHTSPEED_WRITE_THROUGH_MIB.*{message}"):
        _load(monkeypatch, "LIGHTSPEED_WRITE_THROUGH_MIB", raw)
