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


def test_a_worker_node_is_interrupted_not_killed(monkeypatch):
    # On a node other than 0, run_node starts and watches the ranks; Ctrl-C must reach its `finally`
    # (which stops them gracefully) as a KeyboardInterrupt, not end the process on the spot.
    import lightspeed
    from lightspeed_gateway.cli import serve
    from lightspeed_gateway.cli import signals as sig

    seen = []

    def run_node(config):
        seen.append(signal.getsignal(signal.SIGINT))
        raise KeyboardInterrupt

    monkeypatch.setattr(lightspeed, "run_node", run_node)
    from lightspeed_gateway.cli import build_parser

    parsed, _ = build_parser().parse_known_args(["serve", "--load-format", "dummy"])
    with exit_at_once():
        assert serve.run(parsed) == 130
    assert seen == [sig._raise_interrupt]


def test_the_tokenizer_libraries_import_before_the_handover():
    # serve() imports them while a signal still exits at once; loading would otherwise import torch
    # under the KeyboardInterrupt handler.
    code = ("import sys; from lightspeed import import_tokenizer_libraries; import_tokenizer_libraries(); "
            "print('transformers' in sys.modules and 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr
