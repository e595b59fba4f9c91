"""The `lightspeed` command: serve, env, chat, bench."""

from __future__ import annotations

import argparse
import sys

from lightspeed_gateway.cli import bench, chat, env, serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightspeed", description="Lightspeed: an LLM inference engine with an OpenAI-compatible server."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_parser(sub)
    env.add_parser(sub)
    chat.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        # Everything after `bench` belongs to lightspeed_bench's own parser (its --help included).
        return bench.run(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
