"""The H200 scripts run only on a lent GPU, so a typo in one costs a device call: check them here.

Each must parse (`bash -n`), say how it is called in its header, and name only scripts that exist.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "tools/bench/h200").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses_and_documents_its_call(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    header = script.read_text().split("\nset ", 1)[0]
    assert script.name in header or "usage" in header.lower(), f"{script.name}: no call shown in its header"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_it_calls_exist(script):
    for called in re.findall(r"tools/bench/h200/([\w.-]+\.sh)", script.read_text()):
        assert (ROOT / "tools/bench/h200" / called).exists(), f"{script.name} calls missing {called}"
