"""Where the GPU sits idle between kernels, from a chrome trace (`profile_gpu.py --trace`).

A decode step replayed from a CUDA graph is a few hundred short kernels. The step's wall time is
their busy time plus the idle time between them, and that idle time has two causes with different
fixes: the short gaps at every kernel boundary inside a graph (the GPU finishing one kernel and
starting the next: fewer kernels, i.e. fusion, removes them) and the long gaps where the GPU waited
for the host to launch the next work (the step loop). `--split-us` separates the two (default 5 us:
the H200's in-graph boundaries measure ~0.4 us, host waits tens of us).

    python trace_gaps.py TRACE.json --steps 62 [--split-us 5] [--top 10] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys


def kernel_events(trace: dict) -> list[dict]:
    """The trace's GPU kernels (category "kernel"), by start time."""
    return sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def gap_report(kernels: list[dict], steps: int, split_us: float = 5.0, top: int = 10) -> dict:
    """Busy and idle microseconds per step; idle split at `split_us` into boundary and host gaps,
    with the kernel pairs that hold the most of each."""
    if len(kernels) < 2 or steps < 1:
        raise ValueError("need at least two kernels and one step")
    span = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    # Overlapping kernels (concurrent streams, PDL waits) count once: busy is the union of intervals.
    busy, end = 0.0, kernels[0]["ts"]
    pairs: dict[str, dict] = {"boundary": collections.defaultdict(list), "host": collections.defaultdict(list)}
    for prev, cur in zip(kernels, kernels[1:], strict=False):  # consecutive pairs
        end = max(end, prev["ts"] + prev["dur"])
        gap = cur["ts"] - end
        if gap > 0:
            kind = "boundary" if gap <= split_us else "host"
            pairs[kind][(prev["name"][:60], cur["name"][:60])].append(gap)
    end = kernels[0]["ts"]
    for k in kernels:
        start = max(k["ts"], end)
        busy += max(0.0, k["ts"] + k["dur"] - start)
        end = max(end, k["ts"] + k["dur"])
    out = {"kernels_per_step": len(kernels) / steps, "span_us_per_step": span / steps,
           "busy_us_per_step": busy / steps, "split_us": split_us}
    for kind, by_pair in pairs.items():
        gaps = [g for v in by_pair.values() for g in v]
        out[kind] = {
            "us_per_step": sum(gaps) / steps, "count_per_step": len(gaps) / steps,
            "median_us": statistics.median(gaps) if gaps else 0.0,
            "top_pairs": [{"before": a, "after": b, "us_per_step": sum(v) / steps, "count_per_step": len(v) / steps}
                          for (a, b), v in sorted(by_pair.items(), key=lambda kv: -sum(kv[1]))[:top]],
        }
    return out


def render(report: dict) -> str:
    lines = [f"{report['kernels_per_step']:.1f} kernels/step; span {report['span_us_per_step']:.1f} us/step = "
             f"busy {report['busy_us_per_step']:.1f} + idle at kernel boundaries (<= {report['split_us']:g} us) "
             f"{report['boundary']['us_per_step']:.1f} + idle waiting for the host {report['host']['us_per_step']:.1f}"]
    for kind in ("boundary", "host"):
        r = report[kind]
        lines.append(f"\n{kind}: {r['count_per_step']:.1f} gaps/step, median {r['median_us']:.2f} us")
        lines += [f"  {p['us_per_step']:7.1f} us/step  {p['count_per_step']:6.1f}/step  {p['before']} -> {p['after']}"
                  for p in r["top_pairs"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, required=True, help="engine steps the trace holds (profile_gpu's md says)")
    ap.add_argument("--split-us", type=float, default=5.0)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        report = gap_report(kernel_events(json.load(f)), args.steps, args.split_us, args.top)
    print(render(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
