"""``lightspeed-kernel list`` and ``lightspeed-kernel explain FAMILY MODE --dtype bfloat16``."""

from __future__ import annotations

import argparse
import sys

from .registry import KernelSelectionError, Platform, current_platform, explain, list_kernels


def _parse_kv(items: list[str]) -> dict[str, object]:
    result: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--trait expects key=value, got {item!r}")
        result[key] = int(value) if value.lstrip("-").isdigit() else value
    return result


def _cmd_list(args: argparse.Namespace) -> int:
    specs = list_kernels(args.family)
    print(f"{'family/mode':<30} {'name':<32} {'solution':<12} {'prio':>4}  capability / dtypes / features")
    for spec in specs:
        dtypes = (
            ",".join(sorted(str(d).removeprefix("torch.") for d in spec.dtypes)) if spec.dtypes else "any"
        )
        features = ",".join(sorted(spec.features)) or "-"
        print(
            f"{spec.key:<30} {spec.name:<32} {spec.solution:<12} {spec.priority:>4}  {spec.capability} / {dtypes} / {features}"
        )
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    platform = Platform.parse(args.platform) if args.platform else current_platform()
    kwargs = dict(
        features=args.feature or None,
        platform=platform,
        traits=_parse_kv(args.trait or []),
        objective=args.objective,
        override=args.override,
    )
    try:
        result = explain(args.family, args.mode, args.dtype, **kwargs)
    except (KernelSelectionError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result)
    return 0 if result.selected else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lightspeed-kernel", description="Inspect the Lightspeed kernel registry."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="every registered kernel")
    p_list.add_argument("family", nargs="?", help="only this family")
    p_list.set_defaults(func=_cmd_list)
    p_explain = sub.add_parser(
        "explain", help="rank the candidates of FAMILY MODE, with reasons for rejections"
    )
    p_explain.add_argument("family")
    p_explain.add_argument("mode")
    p_explain.add_argument("--dtype", default=None, help="activation dtype, e.g. bfloat16")
    p_explain.add_argument(
        "--platform", default=None, help="cpu, cuda, sm_90, cuda:10.0, rocm:9.4 (default: this machine)"
    )
    p_explain.add_argument("--feature", action="append", help="required feature (repeatable), e.g. fp8_kv")
    p_explain.add_argument("--trait", action="append", help="required trait key=value (repeatable)")
    p_explain.add_argument("--objective", default="default")
    p_explain.add_argument("--override", default=None, help="force this kernel name")
    p_explain.set_defaults(func=_cmd_explain)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
