"""The 10^6-event fuzz run (slow): the C++ property test built by `make test-cpp`."""

import os
import subprocess
from pathlib import Path

import pytest

BINARY = Path(__file__).resolve().parents[2] / "build" / "scheduler-tests" / "tests" / "cpp" / "test_fuzz"


@pytest.mark.slow
def test_fuzz_one_million_events():
    if not BINARY.is_file():
        pytest.skip("build the C++ tests first: make test-cpp")
    env = dict(os.environ, LIGHTSPEED_FUZZ_EVENTS="1000000")
    result = subprocess.run([str(BINARY)], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "fuzz: 1000000 events" in result.stdout
