"""lightspeed_mla.pdl: the package's decode kernels launch with programmatic dependent launch exactly when the
kernel package's own decode-path kernels do (one switch, LIGHTSPEED_KERNEL_PDL, and one capability rule)."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel.triton import _common
from lightspeed_mla import pdl


@pytest.fixture
def kernel_pdl(monkeypatch):
    def set_env(value: str | None, capable: bool = True):
        if value is None:
            monkeypatch.delenv("LIGHTSPEED_KERNEL_PDL", raising=False)
        else:
            monkeypatch.setenv("LIGHTSPEED_KERNEL_PDL", value)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        monkeypatch.setattr(_common, "_pdl_capable", lambda index: capable)
        lk.refresh()

    yield set_env
    monkeypatch.undo()
    lk.refresh()


def test_follows_the_kernel_packages_switch_and_capability(kernel_pdl):
    gpu = torch.device("cuda", 0)
    kernel_pdl(None)
    assert pdl.pdl_launch_args(gpu) == {"USE_PDL": True, "launch_pdl": True} and pdl.pdl_enabled(gpu)
    assert not pdl.pdl_enabled(torch.device("cpu"))
    kernel_pdl("0")
    assert pdl.pdl_launch_args(gpu) == {"USE_PDL": False} and not pdl.pdl_enabled(gpu)
    kernel_pdl("1", capable=False)
    assert not pdl.pdl_enabled(gpu)


def test_the_interpreter_runs_the_kernels_without_pdl(kernel_pdl, monkeypatch):
    kernel_pdl("1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    lk.refresh()
    assert not pdl.pdl_enabled(torch.device("cuda", 0))
