#!/usr/bin/env python
"""Where an `mla_decode_sm90` CTA's time goes, from the kernel's phase timers, on the GPU.

Why: 132 one-split CTAs cost 23.1 µs with 1 key tile each and 47.8 µs with 10 (mla_splits.py's `cta_*`
points), so a CTA costs ~20 µs besides its ~2.75 µs tiles, and nothing said whether that is the launch,
the query-tile load, the ring's first fill, the page-id reads or the epilogue. The timer build of the
kernel (sm90.load_extension(phase_timers=True); the phases are sm90.PHASES, described in
cuda/mla_decode_sm90.h) stamps %globaltimer at each phase of each CTA; a one-thread kernel stamps the
stream just before and after the decode, which brackets its launch and teardown.

    python tools/bench/mla_phases.py --out DIR [--points cta_1tile,cta_10tiles,b1,b4,b16] [--reps 5]

Per point and cache kind: a warm-up call, then --reps calls, each after a write that flushes the L2
(mla.py's FLUSH_BYTES); each launch is summarised on its own (µs from its first CTA's entry: each
phase's median and max over the CTAs, the median from each CTA's own entry, the spread of CTA entries;
the cycles each role waited, from the kernel's counters, sm90.COUNTERS) and the table gives the median
of those summaries over the reps. The decode kernel alone runs (no split combine). Writes DIR/mla_phases_<date>_<device>.{json,md}; the JSON keeps every launch's stamps
(ns after the mark before it, -1 where not reached) and the mark after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from lightspeed_mla import sm90  # noqa: E402
from mla_splits import POINTS  # noqa: E402
from result_files import result_stem  # noqa: E402

from mla import FLUSH_BYTES, SCALE, DecodeBench, _git_commit  # noqa: E402

DEFAULT_POINTS = "cta_1tile,cta_10tiles,b1,b4,b16"
# --kinds: a cache kind, or an FP8 variant of the kernel (its cache kind and run() flags)
KINDS = {"bf16": ("bf16", {}), "fp8": ("fp8", {}), "fp8qk": ("fp8", {"fp8_scores": True}),
         "fp8mma": ("fp8", {"fp8_scores": True, "fp8_pv": True})}


def summarise(stamps: np.ndarray, before_ns: int | None = None, after_ns: int | None = None,
              phases: tuple[str, ...] = sm90.PHASES) -> dict:
    """One launch's stamps (ns, [CTAs, phases], 0 = not reached) in µs from its earliest entry stamp.
    before_ns / after_ns: the stream's marks around the launch (launch gap, drain gap, wall)."""
    stamps = np.asarray(stamps, dtype=np.int64)
    live = stamps[stamps[:, 0] > 0]
    t0 = int(live[:, 0].min())
    reached = live > 0
    since_launch = np.where(reached, live - t0, 0) / 1e3  # µs
    since_entry = np.where(reached, live - live[:, :1], 0) / 1e3
    table = {}
    for i, name in enumerate(phases):
        got = reached[:, i]
        if not got.any():
            table[name] = {"ctas": 0, "median_us": None, "max_us": None, "cta_median_us": None}
            continue
        table[name] = {"ctas": int(got.sum()), "median_us": _us(np.median(since_launch[got, i])),
                       "max_us": _us(since_launch[got, i].max()),
                       "cta_median_us": _us(np.median(since_entry[got, i]))}
    last = int(live[reached].max())
    ticks = np.diff(np.unique(live[reached]))
    out = {"ctas": len(live), "ramp_us": _us(since_launch[:, 0].max()),
           "entry_median_us": _us(np.median(since_launch[:, 0])), "span_us": _us((last - t0) / 1e3),
           "resolution_ns": int(ticks.min()) if ticks.size else None, "phases": table}
    if before_ns is not None and after_ns is not None:
        out.update(launch_gap_us=_us((t0 - before_ns) / 1e3), drain_gap_us=_us((after_ns - last) / 1e3),
                   wall_us=_us((after_ns - before_ns) / 1e3))
    return out


def summarise_counters(raw: np.ndarray, phases: tuple[str, ...] = sm90.PHASES,
                       counters: tuple[str, ...] = sm90.COUNTERS) -> dict:
    """One launch's cycle counters ([CTAs, phases + counters] as the kernel wrote them): per wait counter,
    the median over the CTAs that ran key tiles of its summed wait in µs and as a share of the CTA's
    entry-to-epilogue time. Each CTA's cycles are turned into ns with its own rate (its ns stamps at entry
    and epilogue over its %clock64 at both); `ghz` is the median rate."""
    raw = np.asarray(raw, dtype=np.int64)
    stamps, counts = raw[:, :len(phases)], raw[:, len(phases):]
    entry, epilogue = stamps[:, phases.index("entry")], stamps[:, phases.index("epilogue")]
    clock0, clock1 = counts[:, counters.index("clock_entry")], counts[:, counters.index("clock_epilogue")]
    ran = (stamps[:, phases.index("first_tile")] > 0) & (epilogue > entry) & (clock1 > clock0)
    if not ran.any():
        return {}
    span_ns = (epilogue - entry)[ran]
    ns_per_cycle = span_ns / (clock1 - clock0)[ran]
    out = {"ghz": round(float(1 / np.median(ns_per_cycle)), 3)}
    for i, name in enumerate(counters):
        if not name.startswith("clock_"):
            waited = counts[ran, i] * ns_per_cycle
            out[name] = {"median_us": _us(np.median(waited) / 1e3), "share": round(float(np.median(waited / span_ns)), 3)}
    return out


def _us(x) -> float:
    return round(float(x), 3)


def median_summary(summaries: list[dict]) -> dict:
    """Field by field median of `summarise` results (None where no launch has the field)."""
    if isinstance(summaries[0], dict):
        return {k: median_summary([s.get(k) for s in summaries]) for k in summaries[0]}
    values = [v for v in summaries if v is not None]
    if not values:
        return None
    return int(np.median(values)) if isinstance(values[0], int) else _us(np.median(values))


def measure_point(bench: DecodeBench, ext, flush: torch.Tensor, kind: str, batch: int, heads: int, q_len: int,
                  ctx: int, reps: int) -> dict:
    """The timer build on one point (mla_splits.sweep_point's inputs, the planner's split count); kind: a
    key of KINDS."""
    cache_kind, flags = KINDS[kind]
    cache, page_table, qsl, lens, q, out = bench.point(cache_kind, batch, heads, q_len, ctx, seed=7)
    plan = sm90.plan(bench.ws, qsl, lens, heads, page_size=bench.page_size, softmax_scale=SCALE,
                     cache_kind=cache_kind)
    sm90.check_run_inputs(plan, q, cache, page_table, out, None)
    stamps, marks = sm90.phase_timer_buffer(plan), torch.zeros(2, dtype=torch.int64, device="cuda")

    def bracketed():
        ext.globaltimer_mark(marks[0:1])
        sm90.launch(plan, q, cache, page_table, out, phase_ns=stamps, **flags)
        ext.globaltimer_mark(marks[1:2])

    bracketed()  # warm-up
    torch.cuda.synchronize()
    launches, summaries = [], []
    for _ in range(reps):
        stamps.zero_()
        flush.zero_()
        bracketed()
        torch.cuda.synchronize()
        raw, (before, after) = stamps.cpu().numpy(), marks.tolist()
        ns = raw[:, :len(sm90.PHASES)]
        launches.append({"after_ns": after - before, "stamps_ns": np.where(ns > 0, ns - before, -1).tolist(),
                         "counters": raw[:, len(sm90.PHASES):].tolist()})
        summaries.append({**summarise(ns, before, after), "counters": summarise_counters(raw)})
    return {"kind": kind, "batch": batch, "heads": heads, "q_len": q_len, "ctx": ctx, "splits": plan.num_splits,
            "row_tiles": plan.row_tiles, "summary": median_summary(summaries), "launches": launches}


def write_markdown(result: dict, path: Path) -> None:
    lines = [f"# {sm90.KERNEL_NAME} phase timers on {result['device']}", "",
             f"commit {result['commit']}, torch {result['torch']}, timer build {result['build_s']} s. "
             f"Median of {result['reps']} launches, each after an L2 flush; µs from the launch's first CTA entry "
             "(the phases: sm90.PHASES, cuda/mla_decode_sm90.h). launch gap: the stream's mark before the "
             "decode to its first entry; drain gap: the last stamp to the mark after; wall: mark to mark.", ""]
    for r in result["rows"]:
        s = r["summary"]
        lines += [f"## {r['point']}: {r['kind']}, batch {r['batch']}, {r['heads']} heads, q_len {r['q_len']}, "
                  f"ctx {r['ctx']} ({r['splits']} splits x {r['row_tiles']} row tiles)", "",
                  f"{s['ctas']} CTAs; entry ramp {s['ramp_us']} µs (median entry {s['entry_median_us']}); "
                  f"span {s['span_us']} µs; launch gap {s.get('launch_gap_us')}, drain gap {s.get('drain_gap_us')}, "
                  f"wall {s.get('wall_us')} µs; timer resolution seen {s['resolution_ns']} ns", "",
                  "| phase | CTAs | median µs | max µs | median µs from own entry |", "|---|---|---|---|---|"]
        for name, p in s["phases"].items():
            lines.append(f"| {name} | {p['ctas']} | {p['median_us']} | {p['max_us']} | {p['cta_median_us']} |")
        waits = {k: v for k, v in (s.get("counters") or {}).items() if isinstance(v, dict)}
        if waits:
            lines += ["", f"Waits (median over CTAs; {s['counters']['ghz']} GHz): "
                      + "; ".join(f"{k} {v['median_us']} µs ({100 * v['share']:.0f}%)" for k, v in waits.items())]
        lines.append("")
    path.write_text("\n".join(lines))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--points", default=DEFAULT_POINTS, help=f"of mla_splits.POINTS: {', '.join(POINTS)}")
    ap.add_argument("--kinds", default="bf16,fp8", help=f"of {', '.join(KINDS)}")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        ap.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    started = time.monotonic()
    ext = sm90.load_extension(phase_timers=True, verbose=True)
    build_s = round(time.monotonic() - started, 1)
    assert ext.num_phases == len(sm90.PHASES), "sm90.PHASES and the kernel's MlaPhase differ"
    assert ext.num_counters == len(sm90.COUNTERS), "sm90.COUNTERS and the kernel's MlaCounter differ"
    names = args.points.split(",")
    bench = DecodeBench(max(POINTS[n][0] * POINTS[n][3] for n in names) + (1 << 16))
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    for kind in args.kinds.split(","):
        for name in names:
            row = {"point": name, **measure_point(bench, ext, flush, kind, *POINTS[name], reps=args.reps)}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "launches"}), flush=True)
    result = {"kernel": sm90.KERNEL_NAME, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "commit": args.commit or _git_commit(), "build_s": build_s, "reps": args.reps, "phases": sm90.PHASES, "counters": sm90.COUNTERS,
              "rows": rows}
    stem = result_stem(args.out, "mla_phases", result["device"])
    stem.with_suffix(".json").write_text(json.dumps(result))
    write_markdown(result, stem.with_suffix(".md"))
    print(f"wrote {stem}.{{json,md}} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
