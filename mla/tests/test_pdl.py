"""lightspeed_mla.pdl: the package's decode kernels launch with programmatic dependent launch exactly when the
kernel package's own decode-path kernels do (one switch, LIGHTSPEED_KERNEL_PDL, and one capability rule)."""

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel.triton import _common
from lightspeed_mla import pdl


@pytest.mark.parametrize("switch,capable,interpret,on", [
    (None, True, None, True),    # default: on where the GPU and Triton can
    ("0", True, None, False),    # turned off
    ("1", False, None, False),   # pre-Hopper, ROCm, or a Triton without launch_pdl
    ("1", True, "1", False),     # the CPU interpreter
])
def test_mla_launches_with_pdl_exactly_when_the_kernel_package_would(monkeypatch, switch, capable, interpret, on):
    for name, value in (("LIGHTSPEED_KERNEL_PDL", switch), ("TRITON_INTERPRET", interpret)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(_common, "_pdl_capable", lambda index: capable)
    lk.refresh()
    try:
        gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
        assert pdl.pdl_enabled(gpu) is on and not pdl.pdl_enabled(cpu)
        assert pdl.pdl_launch_args(gpu) == ({"USE_PDL": True, "launch_pdl": True} if on else {"USE_PDL": False})
    finally:
        monkeypatch.undo()
        lk.refresh()
