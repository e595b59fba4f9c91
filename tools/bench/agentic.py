#!/usr/bin/env python3
"""Run the agentic benchmark without installing: `python tools/bench/agentic.py [args]` = `lightspeed-bench agentic [args]`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightspeed_bench.cli import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if not argv or argv[0] not in ("agentic", "plot", "--version"):
        argv = ["agentic", *argv]
    sys.exit(main(argv))
