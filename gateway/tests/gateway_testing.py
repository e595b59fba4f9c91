"""Test helpers: one `lightspeed serve` subprocess per test module, on a free port, 127.0.0.1 only.

The engine is the real one (`lightspeed.AsyncLLM` on the default model, CPU). Setting
LIGHTSPEED_GATEWAY_TEST_ENGINE=fake runs the same CLI and app over tests/gateway_fake_engine.py instead,
for working on the gateway while the engine is unavailable.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ENGINE_KIND = os.environ.get("LIGHTSPEED_GATEWAY_TEST_ENGINE", "real")
READY = re.compile(r"Lightspeed ready in [0-9.]+ s: (http://\S+)")
# Small and fast on 2 CPU cores; tests override what they need.
# One torch thread: on 2 shared cores, OpenMP threads spin-waiting on each other cost more than they give.
BASE_ARGS = ["--max-model-len", "1024", "--max-num-seqs", "8", "--kv-cache-memory", "64MiB", "--seed", "0",
             "--num-threads", "1"]

requires_real_engine = pytest.mark.skipif(ENGINE_KIND != "real", reason="needs the real engine (sampler, prefix cache)")


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry.name))
    return out


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class ServerProcess:
    """A running `lightspeed serve`; `lines` collects its output."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, timeout_s: float = 240.0) -> None:
        if ENGINE_KIND == "fake":
            cmd = [sys.executable, str(HERE / "gateway_fake_server.py")]
        else:
            cmd = [sys.executable, "-c", "import sys; from lightspeed_gateway.cli import main; "
                   "sys.exit(main(['serve', *sys.argv[1:]]))"]
        # HERE first, then the caller's path (a worktree's packages before the installed ones).
        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*cmd, "--port", "0", "--host", "127.0.0.1", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=full_env)
        self.lines: list[str] = []
        self.url: str | None = None
        self.ready_s: float | None = None
        ready = threading.Event()

        def pump() -> None:
            for line in self.proc.stdout:
                self.lines.append(line)
                match = READY.search(line)
                if match and self.url is None:
                    self.url, self.ready_s = match.group(1), time.monotonic() - self.started
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout_s) or self.url is None:
            self.proc.kill()
            raise RuntimeError("server did not get ready:\n" + "".join(self.lines[-50:]))
        self.engine_pids = child_pids(self.proc.pid)

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_server(args: list[str] = (), env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess([*BASE_ARGS, *args], env)


def stop_cleanly(proc: ServerProcess, sig: int = signal.SIGTERM) -> None:
    """Stop the server; it must exit 0, take its engine core process with it, and never have logged a
    ZMQ error (shutdown order) or an ASGI exception (a client leaving is a normal event)."""
    code = proc.stop(sig)
    assert code == 0, proc.output()[-3000:]
    for noise in ("ZMQError", "Exception in ASGI application"):
        assert noise not in proc.output(), proc.output()[-3000:]
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in proc.engine_pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in proc.engine_pids), "orphaned engine core process"
