"""Process behaviour of `lightspeed serve`: a busy port is reported before the model loads; SIGINT and
SIGTERM at any point of start-up end the server without a traceback and without an orphaned core."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from gateway_testing import BASE_ARGS, HERE, child_pids, pid_alive

SERVE = [sys.executable, "-c", "import sys; from lightspeed_gateway.cli import main; sys.exit(main(['serve', *sys.argv[1:]]))"]


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


class Started:
    """A `lightspeed serve` whose output lines are collected as they come."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen([*SERVE, *BASE_ARGS, "--host", "127.0.0.1", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=_env())
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.thread.start()

    def wait_for(self, text: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None and time.monotonic() < deadline, "".join(self.lines)
            time.sleep(0.02)

    def finish(self, timeout_s: float = 120) -> tuple[int, str]:
        code = self.proc.wait(timeout_s)
        self.thread.join(5)
        return code, "".join(self.lines)


def test_busy_port_is_one_line_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        code, output = Started(["--port", str(port)]).finish()
    assert code == 1, output
    assert "cannot listen on 127.0.0.1" in output and "loading" not in output and "Traceback" not in output
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", ["importing", "loading the model"])
def test_a_signal_during_start_up_stops_quietly(sig, phase):
    server = Started(["--port", "0"])
    cores: list[int] = []
    if phase == "importing":
        time.sleep(0.3)
    else:
        server.wait_for("loading")
        deadline = time.monotonic() + 60
        while not cores and time.monotonic() < deadline:  # the engine core has started loading
            cores = child_pids(server.proc.pid)
            time.sleep(0.05)
        assert cores
    server.proc.send_signal(sig)
    code, output = server.finish()
    assert code in (0, 130, -signal.SIGTERM), output
    assert "Traceback" not in output and "Error" not in output.replace("Lightspeed", ""), output
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in cores) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in cores), "orphaned engine core"
