"""The start-up signal phases of `lightspeed serve` (cli/signals.py)."""

import signal
import subprocess
import sys

import pytest

from lightspeed_gateway.cli.signals import INTERRUPTED, exit_at_once, interrupt_on_signal


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_before_the_engine_starts_a_signal_exits_at_once(sig):
    # Python code here stands in for an extension's import: the signal must not raise inside it.
    child = ("import os, signal, time\n"
             "from lightspeed_gateway.cli.signals import exit_at_once\n"
             "with exit_at_once():\n"
             "    print('importing', flush=True)\n"
             f"    os.kill(os.getpid(), {int(sig)})\n"
             "    time.sleep(30)\n"
             "print('not reached')\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=20)
    assert done.returncode == INTERRUPTED, done.stderr
    assert done.stdout == "importing\n" and done.stderr == ""


def test_interrupt_phase_raises_and_restores_the_handlers():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with exit_at_once(), interrupt_on_signal():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
    assert {sig: signal.getsignal(sig) for sig in before} == before
