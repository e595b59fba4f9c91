"""The `lightspeed` command: serve, env, chat, bench.

Subcommand modules load inside `main`, so a Ctrl-C while they load (torch, the engine) exits
quietly with status 130 instead of printing an import traceback; for `serve`, a signal before the
engine core starts exits at once (see signals.py: an interrupt inside an extension's import can
abort the process).
"""

from __future__ import annotations

import argparse
import sys


def version_text() -> str:
    """`lightspeed --version`: the gateway's version and those of the packages it runs on."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for label, dist in (("engine", "lightspeed"), ("scheduler", "lightspeed-scheduler"),
                        ("kernel", "lightspeed-kernel"), ("mla", "lightspeed-mla")):
        try:
            parts.append(f"{label} {version(dist)}")
        except PackageNotFoundError:
            continue
    from lightspeed_gateway import __version__

    return f"lightspeed {__version__} ({', '.join(parts)})" if parts else f"lightspeed {__version__}"


def build_parser() -> argparse.ArgumentParser:
    from lightspeed_gateway.cli import bench, chat, env, serve

    parser = argparse.ArgumentParser(
        prog="lightspeed", description="Lightspeed: an LLM inference engine with an OpenAI-compatible server.")
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.add_parser(sub)
    env.add_parser(sub)
    chat.add_parser(sub)
    bench.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        from lightspeed_gateway.cli.signals import exit_at_once

        with exit_at_once():
            return _run(argv)
    return _run(argv)


def _run(argv: list[str]) -> int:
    try:
        if argv[:1] == ["bench"]:
            from lightspeed_gateway.cli import bench

            # Everything after `bench` belongs to lightspeed_bench's own parser (its --help included).
            return bench.run(argv[1:])
        from lightspeed_gateway.cli.args import unknown_flags_message

        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # reported by the subcommand's parser: its usage, and the nearest flag for a typo
            command_parser = getattr(args, "command_parser", parser)
            command_parser.error(unknown_flags_message(command_parser, unknown))
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
