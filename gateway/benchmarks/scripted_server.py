"""`lightspeed serve` over the real AsyncLLM client with `scripted_core.py` as its engine core
(benchmarks only): the one change is the command that starts the core process."""

import subprocess
import sys
from pathlib import Path

CORE = str(Path(__file__).with_name("scripted_core.py"))
_popen = subprocess.Popen


def _popen_scripted_core(cmd, *args, **kwargs):
    if isinstance(cmd, list) and cmd[1:3] == ["-m", "lightspeed.core.engine_core"]:
        cmd = [cmd[0], CORE, *cmd[3:]]
    return _popen(cmd, *args, **kwargs)


if __name__ == "__main__":
    subprocess.Popen = _popen_scripted_core
    from lightspeed_gateway.cli import main

    sys.exit(main(["serve", *sys.argv[1:]]))
