#!/usr/bin/env python
"""A/B of one LIGHTSPEED_KERNEL_* variable on paged decode attention alone (Llama-3-8B heads: 32 q / 8 kv,
head dim 128, bf16), the planned launch replayed from a CUDA graph, L2 flushed between runs.

    python tools/bench/decode_env_ab.py --var LIGHTSPEED_KERNEL_DECODE_SMALL_GRID --values 1,0 \
        --shapes 16:1:1024,16:1:8192,16:1:23552,16:1:32768,16:16:8192,16:64:1024 --out OUT

Each shape is timed under every value in turn, `--rounds` times over (A B A B ...: drift hits both
alike), and the median of a value's rounds is reported with its fraction of 4.27 TB/s (KV bytes read /
time) and its ratio to the first value. Both arms check against each other (relative error), so a value
that breaks the kernel shows. Writes OUT/decode_env_ab_<date-time>_<device>.json/.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys

import torch
from kernels import HBM_BYTES_PER_S, _decode_setup, bench_graph_ms, rel_err
from result_files import git_commit, result_stem

HQ, HKV, D = 32, 8, 128


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = [tuple(int(x) for x in part.split(":")) for part in text.split(",") if part]
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"--shapes wants PAGE:BATCH:CONTEXT,... got {text!r}")
    return shapes


def set_value(var: str, value: str) -> None:
    """Set the variable and drop every snapshot or plan made under the old value."""
    import lightspeed_kernel as lk
    from lightspeed_kernel.triton import attention_decode as dec

    os.environ[var] = value
    lk.refresh()
    dec.plan_decode.cache_clear()


def measure(shape, var: str, values: list[str], rounds: int, quick: bool, dev) -> dict:
    from lightspeed_kernel.triton import attention_decode as dec

    page_size, batch, ctx = shape
    q, kc, vc, pt, qsl, sl = _decode_setup(batch, ctx, page_size, HQ, HKV, D, dev)
    times: dict[str, list[float]] = {v: [] for v in values}
    outs: dict[str, torch.Tensor] = {}
    splits: dict[str, int] = {}
    for _ in range(rounds):
        for value in values:
            set_value(var, value)
            plan = dec.plan_decode(batch, HQ, HKV, D, page_size, pt.shape[1], 1)
            ws = torch.empty(max(1, dec.decode_workspace_numel(plan, batch, HQ, D)), device=dev)
            out = torch.empty_like(q)
            run = functools.partial(dec.run_decode, plan, q, kc, vc, pt, qsl, sl, scale=1.0 / math.sqrt(D),
                                    out=out, workspace=ws)
            times[value].append(bench_graph_ms(run, quick))
            outs[value], splits[value] = out, plan.num_splits
    kv_bytes = 2 * batch * ctx * HKV * D * kc.element_size()
    base = statistics.median(times[values[0]])
    row = {"page_size": page_size, "batch": batch, "context": ctx, "kv_bytes": kv_bytes, "arms": {}}
    for value in values:
        ms = statistics.median(times[value])
        row["arms"][value] = {"ms": ms, "rounds_ms": times[value], "num_splits": splits[value],
                              "hbm_fraction": kv_bytes / ms / 1e9 / (HBM_BYTES_PER_S / 1e12),
                              "over_first": ms / base, "rel_err_vs_first": rel_err(outs[value], outs[values[0]])}
    return row


def to_markdown(result: dict) -> str:
    var, values = result["var"], result["values"]
    lines = [f"# Paged decode A/B of {var} ({', '.join(values)}), {result['device']}, commit {result['commit']}", "",
             "Llama-3-8B heads (32 q / 8 kv, D 128), bf16, one query token, the planned launch replayed from a CUDA "
             f"graph, L2 flushed; median of {result['rounds']} alternating rounds.", "",
             "| page | batch | context | " + " | ".join(f"{v}: us (HBM)" for v in values) + " | "
             + " | ".join(f"{v} / {values[0]}" for v in values[1:]) + " | max rel err |",
             "|---" * (4 + 2 * len(values) - 1) + "|"]
    for r in result["rows"]:
        arms = r["arms"]
        lines.append(f"| {r['page_size']} | {r['batch']} | {r['context']} | "
                     + " | ".join(f"{arms[v]['ms'] * 1e3:.1f} ({arms[v]['hbm_fraction']:.0%})" for v in values) + " | "
                     + " | ".join(f"{arms[v]['over_first']:.3f}" for v in values[1:]) + " | "
                     + f"{max(a['rel_err_vs_first'] for a in arms.values()):.1e} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--var", required=True, help="a LIGHTSPEED_KERNEL_* variable")
    ap.add_argument("--values", default="0,1", help="comma-separated values; the first is the baseline")
    ap.add_argument("--shapes", default="16:1:1024,16:1:8192,16:1:32768,16:16:8192", help="PAGE:BATCH:CONTEXT,...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1): checks the script")
    args = ap.parse_args(argv)
    if not args.var.startswith("LIGHTSPEED_KERNEL_"):
        print(f"--var must be a LIGHTSPEED_KERNEL_* variable, got {args.var!r}", file=sys.stderr)
        return 2
    values = [v.strip() for v in args.values.split(",") if v.strip()]
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if len(values) < 2:
        print("--values needs at least two values", file=sys.stderr)
        return 2
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        print("no CUDA device: run with --smoke (TRITON_INTERPRET=1) to check the script only", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = []
    for shape in shapes:
        row = measure(shape, args.var, values, args.rounds, args.smoke, dev)
        rows.append(row)
        print(f"ps={shape[0]} B={shape[1]} ctx={shape[2]}: " + ", ".join(
            f"{v} {a['ms'] * 1e3:.1f} us ({a['hbm_fraction']:.0%}, x{a['over_first']:.3f})" for v, a in row["arms"].items()),
            flush=True)
    device = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu smoke"
    result = {"var": args.var, "values": values, "rounds": args.rounds, "device": device,
              "commit": args.commit or git_commit(), "torch": torch.__version__, "rows": rows}
    stem = result_stem(args.out, "decode_env_ab")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(to_markdown(result))
    print(f"wrote {stem}.json/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
