#!/usr/bin/env python
"""The skinny GEMM (lightspeed_kernel.triton.gemv, 1..64 rows) against cuBLAS (F.linear) on the
Llama-3.1-8B decode shapes, at every config of its sweep space.

Per (M, N, K): cuBLAS, then each config of `gemv.sweep_configs` (choose_config's pick first), timed
with triton.testing.do_bench (median; it zeroes a 256 MB buffer before every run, so the weight
comes from HBM, not L2). Bandwidth counts the bytes a call must move: weight N·K + x M·K + out
M·N, 2 bytes each, over --peak-tbs (default 4.27 TB/s, the H200's measured HBM read; 3.35 on an H100). Every config's output is checked
against F.linear (a config with rel. error >= 1e-2 is marked bad and never "best"). The markdown
names the best config per shape, its speed-up over cuBLAS, and the M = 1 decode step's GEMM time
summed over 32 layers + lm_head both ways.

    python tools/bench/gemv.py --out bench/results                      # on the H200
    python tools/bench/gemv.py --out bench/results --m 1,2 --budget-s 400
    python tools/bench/gemv.py --out bench/results --m 32,64 --sample 16 --shapes 6144x4096,4096x4096,28672x4096,4096x14336
    python tools/bench/gemv.py --out /tmp/x --dry-run                   # CPU interpreter, tiny shapes

`--budget-s` bounds the sweep: past it, each remaining shape times only cuBLAS and choose_config's
pick (the row says so). `--sample N` times the pick and N configs spread evenly over the rest of each
shape's space (above 16 rows the space is ~100 configs a shape, too many for one lease). Dry-run times are CPU wall-clock under the interpreter, not GPU figures.
"""

from __future__ import annotations

import argparse
import json
import os
import time

HBM_PEAK_TBS = 4.27
# (N, K) of one Llama-3.1-8B layer (qkv, o, gate_up, down) and the lm_head; 32 layers per step
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]
LAYERS = 32
ROWS = (1, 2, 4, 8, 16)
DRY_SHAPES = [(40, 72), (24, 136)]
DRY_ROWS = (1, 3)
DRY_CONFIGS = 3  # per shape in a dry run (the interpreter is slow)
BAD_REL_ERR = 1e-2


def sample_space(space: list, n: int | None) -> list:
    """The first config (choose_config's pick) and n others spread evenly over the rest; all with n None."""
    if n is None or len(space) <= n + 1:
        return space
    rest = space[1:]
    return [space[0]] + [rest[round(i * (len(rest) - 1) / max(n - 1, 1))] for i in range(n)]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter on tiny shapes (checks the script)")
    ap.add_argument("--m", default=None, help="rows to time, e.g. 1,2 (default 1,2,4,8,16)")
    ap.add_argument("--shapes", default=None, help="NxK list, e.g. 4096x4096,4096x14336 (default the 8B's five)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop sweeping configs after this many seconds")
    ap.add_argument("--max-configs", type=int, default=None, help="configs per shape (default all; dry run 3)")
    ap.add_argument("--sample", type=int, default=None,
                    help="time the pick and this many configs spread evenly over the rest of the space")
    ap.add_argument("--peak-tbs", type=float, default=HBM_PEAK_TBS, help="HBM read peak for the fractions")
    ap.add_argument("--commit", default=None, help="commit measured (default: git's HEAD)")
    args = ap.parse_args(argv)
    if args.dry_run:  # before the first import of triton / lightspeed_kernel: kernels decorate then
        os.environ["TRITON_INTERPRET"] = "1"

    import torch
    import torch.nn.functional as F
    import triton
    from lightspeed_kernel.triton import gemv
    from result_files import git_commit, result_stem

    dev = "cpu" if args.dry_run else "cuda"
    rows_m = [int(v) for v in args.m.split(",")] if args.m else list(DRY_ROWS if args.dry_run else ROWS)
    shapes = parse_shapes(args.shapes) if args.shapes else (DRY_SHAPES if args.dry_run else SHAPES)
    max_configs = args.max_configs or (DRY_CONFIGS if args.dry_run else None)
    num_sms = 4 if args.dry_run else torch.cuda.get_device_properties(0).multi_processor_count
    bench = _wall_clock if args.dry_run else _do_bench
    start = time.monotonic()
    rows = []
    for n, k in shapes:
        torch.manual_seed(n + k)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        for m in rows_m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            moved = 2 * (n * k + m * k + m * n)
            want = F.linear(x, w)
            row = {"m": m, "n": n, "k": k, "bytes": moved, "cublas": _timing(bench(lambda x=x, w=w: F.linear(x, w)), moved, args.peak_tbs),
                   "chosen": vars(gemv.choose_config(m, n, k, num_sms)), "configs": [], "sweep_complete": True}
            space = sample_space(gemv.sweep_configs(m, n, k, num_sms), args.sample)[:max_configs]
            for i, cfg in enumerate(space):
                if i and time.monotonic() - start > args.budget_s:
                    row["sweep_complete"] = False
                    break
                entry = {"config": vars(cfg)}
                try:
                    got = gemv.launch(x, w, None, cfg)
                    entry["rel_err"] = ((got.float() - want.float()).norm() / want.float().norm()).item()
                    entry.update(_timing(bench(lambda x=x, w=w, cfg=cfg: gemv.launch(x, w, None, cfg)), moved, args.peak_tbs))
                except Exception as e:  # a config that does not compile or launch is part of the record
                    entry["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                row["configs"].append(entry)
            row["best"] = _best(row["configs"])
            rows.append(row)
            best = row["best"] or {}
            print(f"M {m:>2} {n}x{k}: cublas {row['cublas']['us']:.2f} us, chosen "
                  f"{row['configs'][0].get('us', float('nan')):.2f} us, best {best.get('us', float('nan')):.2f} us "
                  f"{best.get('config')} ({len(row['configs'])} configs)", flush=True)
        del w

    device = "cpu-interpreter" if args.dry_run else torch.cuda.get_device_name(0)
    commit = args.commit or git_commit()
    result = {"device": device, "commit": commit, "torch": torch.__version__, "triton": triton.__version__,
              "num_sms": num_sms, "peak_tbs": args.peak_tbs, "dry_run": args.dry_run, "rows": rows}
    stem = result_stem(args.out, f"gemv_{commit.replace('+', '-')}", device)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(to_markdown(result))
    print(f"wrote {stem}.json/.md")
    return 0


def _do_bench(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e3  # ms -> us


def _wall_clock(fn) -> float:
    fn()  # the interpreter has nothing to compile; this only keeps the first call out of the figure
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def _timing(us: float, moved: int, peak_tbs: float) -> dict:
    tbs = moved / (us * 1e-6) / 1e12
    return {"us": us, "tbs": tbs, "of_peak": tbs / peak_tbs}


def _best(configs: list[dict]) -> dict | None:
    good = [c for c in configs if "us" in c and c["rel_err"] < BAD_REL_ERR]
    return min(good, key=lambda c: c["us"], default=None)


def _cfg(c: dict | None) -> str:
    if not c:
        return "-"
    c = c.get("config", c)
    path = "dot" if c["use_dot"] else "fma"
    return f"{path} n{c['block_n']} k{c['block_k']} s{c['split_k']} w{c['num_warps']} st{c['num_stages']}"


def to_markdown(result: dict) -> str:
    what = "CPU wall-clock under the Triton interpreter (not GPU figures)" if result["dry_run"] else \
        "triton.testing.do_bench median, L2 flushed before each run"
    lines = [f"# Skinny GEMM vs cuBLAS, {result['device']} (commit {result['commit']}, torch {result['torch']}, "
             f"triton {result['triton']})", "",
             f"bf16, no bias; {what}; TB/s over weight + x + out bytes; of peak = of {result['peak_tbs']} TB/s. "
             f"Configs: path (fma / dot), block_n, block_k, split_k, warps, stages.", "",
             "| M | N x K | cuBLAS us | TB/s | of peak | chosen | us | best config | us | TB/s | of peak "
             "| cuBLAS / best | configs |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in result["rows"]:
        cb, best, first = r["cublas"], r["best"] or {}, r["configs"][0] if r["configs"] else {}
        ratio = cb["us"] / best["us"] if best else None
        bad = sum(1 for c in r["configs"] if "error" in c or c.get("rel_err", 0) >= BAD_REL_ERR)
        count = f"{len(r['configs'])}" + ("" if r["sweep_complete"] else " (budget)") + (f", {bad} bad" if bad else "")
        lines.append(f"| {r['m']} | {r['n']} x {r['k']} | {f(cb['us'])} | {f(cb['tbs'])} | {f(cb['of_peak'] * 100, 0)}% "
                     f"| {_cfg(r['chosen'])} | {f(first.get('us'))} | {_cfg(best)} | {f(best.get('us'))} "
                     f"| {f(best.get('tbs'))} | {f(best['of_peak'] * 100, 0) + '%' if best else '-'} | {f(ratio)} "
                     f"| {count} |")
    step = _decode_step(result["rows"])
    if step:
        lines += ["", f"M = 1 decode step, GEMMs only ({LAYERS} layers x qkv, o, gate_up, down + lm_head): "
                  f"cuBLAS {step[0]:.1f} us, best configs {step[1]:.1f} us."]
    return "\n".join(lines) + "\n"


def _decode_step(rows: list[dict]) -> tuple[float, float] | None:
    """(cuBLAS, best) microseconds of one M = 1 step's GEMMs, when every 8B shape was timed at M = 1."""
    one = {(r["n"], r["k"]): r for r in rows if r["m"] == 1}
    if not all(s in one and one[s]["best"] for s in SHAPES):
        return None
    weight = {s: (1 if s == SHAPES[-1] else LAYERS) for s in SHAPES}
    return (sum(one[s]["cublas"]["us"] * weight[s] for s in SHAPES),
            sum(one[s]["best"]["us"] * weight[s] for s in SHAPES))


if __name__ == "__main__":
    raise SystemExit(main())
