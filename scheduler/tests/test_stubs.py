"""The shipped typed stub exists and matches what nanobind generates from the installed module."""

import subprocess
import sys
from pathlib import Path

import lightspeed_scheduler
from lightspeed_scheduler import _core


def test_stub_is_shipped_and_current(tmp_path: Path):
    package = Path(lightspeed_scheduler.__file__).parent
    shipped = package / "_core.pyi"
    assert shipped.is_file(), "the wheel must ship _core.pyi"
    assert (package / "py.typed").is_file()
    regenerated = tmp_path / "_core.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "lightspeed_scheduler._core",
                    "-o", str(regenerated)], check=True)
    assert regenerated.read_text() == shipped.read_text()


def test_stub_declares_the_contract():
    text = (Path(_core.__file__).parent / "_core.pyi").read_text()
    for name in ("class Scheduler", "class SchedulerConfig", "class RequestSpec", "class Plan",
                 "def next_plan", "def advance", "def submit", "def abort", "def stats", "def request_stats",
                 "def page_table", "def deferred_input_mask", "accepted_counts"):
        assert name in text, name
