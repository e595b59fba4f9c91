"""`lightspeed bench …`: forwards to lightspeed_bench (tools/bench), which owns the benchmark flags."""

from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks (agentic multi-turn sweep, plots): see `lightspeed bench --help`",
                       add_help=False)
    p.add_argument("rest", nargs="*")
    p.set_defaults(func=lambda args: run(args.rest), command_parser=p)


def run(argv: list[str]) -> int:
    try:
        from lightspeed_bench.cli import main as bench_main
    except ImportError as e:
        print(f"lightspeed bench needs the lightspeed-bench package ({e}); install it with "
              "`pip install -e tools/bench` (or `make install`).", file=sys.stderr)
        return 2
    return int(bench_main(argv) or 0)
