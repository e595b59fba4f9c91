"""The CPU emulator of the FP8-MMA kernel (mla/scripts/sm90_emulate.py, which mirrors its layouts by hand) agrees
with the reference: what catches a layout slip in the kernel's design without a GPU."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sm90_emulate.py"


@pytest.mark.parametrize("mode", ["afrag", "fp8mma"])
def test_emulated_kernel_matches_the_reference(mode):
    done = subprocess.run([sys.executable, str(SCRIPT), mode], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
