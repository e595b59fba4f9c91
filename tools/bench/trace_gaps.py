"""Where the GPU sits idle between kernels, from a chrome trace (`profile_gpu.py --trace`).

A decode step replayed from a CUDA graph is a few hundred short kernels. The step's wall time is
their busy time plus the idle time between them, and that idle time has two causes with different
fixes: the short gaps at every kernel boundary inside a graph (the GPU finishing one kernel and
starting the next: fewer kernels, i.e. fusion, removes them) and the long gaps where the GPU waited
for the host to launch the next work (the step loop). `--split-us` separates the two (default 5 us:
the H200's in-graph boundaries measure ~0.4 us, host waits tens of us).

    python trace_gaps.py TRACE.json --steps 62 [--split-us 5] [--top 10] [--json OUT.json]

A third cause is not the host's: a copy between device and host waits for the copy engine, which runs copies
in the order they were queued whatever their stream, and another stream's copies (the KV host tier's
write-through) may hold it. On a stream of kernels every kernel queued behind the copy waits too; on a result
stream of its own the host waits for the copy, and launches late. `copy_waits` lists the copies that started
late while another stream's copy was running: `--copy-waits` prints them per stream.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import itertools
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


def copy_waits(trace: dict, late_us: float = 50.0) -> dict:
    """Per stream: its host<->device copies, and those that started more than `late_us` after they could have
    while another stream's copy was running (queued behind it on the copy engine). A copy on a stream of kernels
    could start when the op before it on the stream ended. One on a stream of copies (a result stream that waits
    for the compute stream) could start when that op ended and every kernel launched before the copy's own launch
    had ended (launch times from the host's runtime calls, matched by correlation id; a kernel without one counts
    from its start, which is never before its launch). Returns {stream: {"copies", "late", "late_us_total",
    "late_us_median"}}."""
    events = trace["traceEvents"]
    launched_at = {e["args"]["correlation"]: e["ts"] for e in events
                   if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    by_stream: dict = collections.defaultdict(list)
    for e in ops:
        by_stream[e["args"].get("stream")].append(e)
    host_copies = [e for e in ops if e.get("cat") == "gpu_memcpy" and ("DtoH" in e["name"] or "HtoD" in e["name"])]
    is_host_copy = {id(e) for e in host_copies}
    # Kernels by launch time, and the latest end among those launched so far: what a copy launched then waits for.
    kernels = sorted((launched_at.get(e["args"].get("correlation"), e["ts"]), e["ts"] + e["dur"])
                     for e in ops if e.get("cat") == "kernel")
    launches = [k[0] for k in kernels]
    ends_so_far = list(itertools.accumulate((k[1] for k in kernels), max))
    out = {}
    for stream, seq in by_stream.items():
        copy_stream = not any(e.get("cat") == "kernel" for e in seq)
        waits, copies = [], 0
        for i, cur in enumerate(seq):
            if id(cur) not in is_host_copy or (i == 0 and not copy_stream):
                continue
            copies += 1
            ready = seq[i - 1]["ts"] + seq[i - 1]["dur"] if i else 0.0
            if copy_stream:
                before = bisect.bisect_left(launches, launched_at.get(cur["args"].get("correlation"), cur["ts"]))
                ready = max(ready, ends_so_far[before - 1] if before else 0.0)
            late = cur["ts"] - ready
            if late > late_us and any(o["args"].get("stream") != stream and o["ts"] < cur["ts"]
                                      and o["ts"] + o["dur"] > ready for o in host_copies):
                waits.append(late)
        out[stream] = {"copies": copies, "late": len(waits), "late_us_total": sum(waits),
                       "late_us_median": statistics.median(waits) if waits else 0.0}
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
    ap.add_argument("--copy-waits", action="store_true",
                    help="also list host copies that queued behind another stream's copies")
    args = ap.parse_args(argv)
    with open(args.trace) as f:
        trace = json.load(f)
    report = gap_report(kernel_events(trace), args.steps, args.split_us, args.top)
    print(render(report))
    if args.copy_waits:
        report["copy_waits"] = copy_waits(trace)
        for stream, w in report["copy_waits"].items():
            print(f"\nstream {stream}: {w['copies']} host copies, {w['late']} queued behind another stream's copy "
                  f"({w['late_us_total'] / args.steps:.1f} us/step, median {w['late_us_median']:.1f} us each)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
