"""The README's commands, run as written: every line of its ```bash blocks and its ```python blocks.

Three liberties, all about the machine rather than the commands: the server listens on a free port
instead of 8000 (``:8000`` is rewritten in every command; a shared machine may have 8000 taken);
`.venv/bin/` is the repository's venv when there is one (CI, after `make install`), else the venv of
the interpreter running the tests; engines use one torch thread (LIGHTSPEED_NUM_THREADS=1: server,
bench client and tests share two cores, where competing OpenMP threads cost more than they give).
Everything runs in a scratch directory, so the bench writes its results there. `make test` is what CI itself runs; for `make serve` the check is that `make install`
has nothing to do once installed (the Makefile's stamps, see test_makefile.py), which needs the
repository's own venv.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
READY = re.compile(r"Lightspeed ready in [0-9.]+ s: (http://\S+)")


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def commands(block: str) -> list[str]:
    """Shell commands of a block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(shlex.join(words))
    return out


def _venv_bin() -> Path:
    own = REPO / ".venv" / "bin"
    return own if (own / "lightspeed").exists() else Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENV = {**os.environ, "LIGHTSPEED_NUM_THREADS": "1"}


def _localize(command: str, port: int) -> list[str]:
    command = command.replace(":8000", f":{port}").replace(".venv/bin/", f"{_venv_bin()}/")
    return shlex.split(command)


class Server:
    def __init__(self, argv: list[str], port: int, cwd: Path) -> None:
        self.proc = subprocess.Popen([*argv, "--port", str(port)], cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=ENV)
        self.lines: list[str] = []
        ready = threading.Event()

        def drain() -> None:  # read all along: a full pipe would block the server
            for line in self.proc.stdout:
                self.lines.append(line)
                if READY.search(line):
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        assert ready.wait(300) and any(READY.search(line) for line in self.lines), "".join(self.lines[-30:])

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(60) == 0, "".join(self.lines[-30:])


def _check(command: str, result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stdout + result.stderr, command
    if command.startswith("curl"):  # an answer, not an error object
        body = json.loads(result.stdout)
        assert "error" not in body, body
        assert body.get("choices") or body.get("object") == "model", body
    if " bench " in command:
        assert re.search(r"^\s+2\s+\d+\s+0\s", result.stdout, re.M), result.stdout  # c=2 ran, no errors


def test_readme_names_the_served_model_as_it_is_served():
    assert '"model": "SmolLM2-135M-Instruct"' in README.read_text()


def test_the_using_it_commands_work_as_written(tmp_path: Path):
    if shutil.which("curl") is None:
        pytest.fail("the README's commands need curl (the CI script installs it)")
    shell = [c for block in blocks("bash") for c in commands(block) if not c.startswith("make ")]
    assert shell and shell[0].startswith(".venv/bin/lightspeed serve"), shell
    port = _free_port()
    server = Server(_localize(shell[0], port), port, tmp_path)
    try:
        for command in shell[1:]:
            assert "lightspeed serve" not in command, "one server per README block"
            stdin = "Hi!\n/exit\n" if " chat" in command else None
            result = subprocess.run(_localize(command, port), cwd=tmp_path, input=stdin, capture_output=True,
                                    text=True, timeout=600, env=ENV)
            _check(command, result)
    finally:
        server.stop()
    assert any((tmp_path / "bench" / "results").glob("agentic_*.json")), "the bench wrote no run file"


def test_the_python_example_works_as_written(tmp_path: Path):
    (example,) = blocks("python")
    result = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env=ENV)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "the example printed no generated text"


def test_make_serve_would_install_nothing(tmp_path: Path):
    lines = [c for block in blocks("bash") for c in commands(block) if c.startswith("make ")]
    assert [c.split()[1] for c in lines] == ["serve", "test"]
    if not (REPO / ".venv" / "bin" / "lightspeed").exists() or shutil.which("make") is None:
        pytest.skip("needs the repository's own .venv (make install) and make")
    up_to_date = subprocess.run(["make", "-q", "install"], cwd=REPO, capture_output=True, text=True,
                                env={**os.environ, "MAKEFLAGS": ""})  # not the flags of a `make test` above us
    assert up_to_date.returncode == 0, "make serve would install again although nothing changed"
