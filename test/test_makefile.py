"""`make install` (and so `make serve` / `make test`) runs an install step only when its inputs changed.

Hermetic: the Makefile runs in a scratch copy of the repository's layout whose `.venv/bin/python`
is a script that records how it was called, so no real pip runs.
"""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("kernel", "mla", "engine", "gateway", "tools/bench")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "requirements-dev.txt").write_text("pytest\n")
    for package in ("scheduler", *PACKAGES):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "pyproject.toml").write_text("[project]\n")
    for source in ("scheduler/CMakeLists.txt", "scheduler/csrc/scheduler.cpp",
                   "scheduler/lightspeed_scheduler/__init__.py"):
        (tmp_path / source).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / source).write_text("\n")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\n')
    python.chmod(0o755)
    return tmp_path


def _install(tree: Path) -> list[str]:
    """The pip commands one `make install` ran."""
    log = tree / "calls.log"
    log.unlink(missing_ok=True)
    subprocess.run(["make", "-s", "install"], cwd=tree, check=True, capture_output=True, text=True,
                   env={**os.environ, "MAKEFLAGS": ""})
    return log.read_text().splitlines() if log.exists() else []


def _touch(tree: Path, changed: str) -> None:
    """Everything (stamps included) a minute old, `changed` new: no file system time resolution
    or clock tick can blur the order."""
    past = time.time() - 60
    for path in tree.rglob("*"):
        os.utime(path, (past, past))
    os.utime(tree / changed, None)


def test_each_install_step_runs_once_then_only_when_its_inputs_change(tree: Path):
    first = _install(tree)
    assert any("-r requirements-dev.txt" in c for c in first)
    assert any("./scheduler" in c for c in first)
    assert any("-e ./engine" in c and "-e ./tools/bench" in c for c in first)
    assert _install(tree) == [], "nothing changed: no pip may run"

    _touch(tree, "scheduler/csrc/scheduler.cpp")
    calls = _install(tree)
    assert len(calls) == 1 and "./scheduler" in calls[0]

    _touch(tree, "engine/pyproject.toml")
    calls = _install(tree)
    assert len(calls) == 1 and "-e ./engine" in calls[0]

    _touch(tree, "requirements-dev.txt")
    calls = _install(tree)
    assert calls and all("./scheduler" not in c and "-e ./" not in c for c in calls)
    assert _install(tree) == []


def test_make_serve_runs_the_server_only_when_installed(tree: Path):
    _install(tree)
    dry = subprocess.run(["make", "-n", "serve"], cwd=tree, check=True, capture_output=True, text=True,
                         env={**os.environ, "MAKEFLAGS": ""}).stdout
    assert "pip" not in dry and "lightspeed serve" in dry
