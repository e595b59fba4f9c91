#!/usr/bin/env python
"""Split-KV sweep of an `mla/decode` kernel on the GPU: for each point, the time at the planner's split
count and at others around it, and where a split's time goes (the decode kernel vs the combine that
merges the split partials, from a torch.profiler trace of eager calls), with each combine variant
(lightspeed_mla.decode.COMBINE_VARIANTS: the serial one-split-a-load loop and the blocked one).

Why: at small batch the planner splits the keys until the grid fills one wave (`choose_num_splits`), so
one request at 80K context gets 128 splits of 640 keys; each split costs a fixed prologue (the 64-row
query tile, the pipeline fill) and writes a 64 x 512 fp32 partial that the combine reads back, which
at batch 1 is ~17 MB beside 94 MB of cache. This says whether fewer, longer splits would be faster.

    python tools/bench/mla_splits.py --out DIR [--kernel mla_decode_sm90] [--points b1,b4,b8,b16]

Writes DIR/mla_splits_<date>_<device>.{json,md}; times are CUDA-graph replays with L2 flushed
(tools/bench/mla.py's `_time_us`), the breakdown is eager (L2 warm), so it is a share, not a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from result_files import result_stem  # noqa: E402

from mla import SCALE, DecodeBench, _git_commit, _time_us, decode_cost  # noqa: E402

# (name, batch, heads, q_len, ctx): the seeds' case (16 heads, q_len 4, 80K) at the batches the issue
# names, and batch 1 (its own target: split-KV alone must fill the GPU).
POINTS = {"b1": (1, 16, 4, 81920), "b4": (4, 16, 4, 81920), "b8": (8, 16, 4, 81920), "b16": (16, 16, 4, 81920),
          "b1q1": (1, 16, 1, 81920), "b16q1_16k": (16, 16, 1, 16384),
          # One CTA per SM with 1 and with 10 key tiles each, one split: the difference is 9 tiles, the
          # rest of the 1-tile time is what a CTA costs besides its tiles (query load, ring fill, epilogue).
          "cta_1tile": (132, 16, 4, 64), "cta_10tiles": (132, 16, 4, 640)}


def candidate_splits(default: int, max_kv: int) -> list[int]:
    """The planner's count, halvings and doublings of it, and 1; each split >= 256 keys."""
    from lightspeed_mla.decode import MAX_SPLITS

    cap = max(1, min(MAX_SPLITS, max_kv // 256))
    wanted = {1, default, max(1, default // 2), max(1, default // 4), max(1, default * 3 // 4), default * 2}
    return sorted(s for s in wanted if 1 <= s <= cap)


def kernel_shares(fn, reps: int = 5) -> dict:
    """GPU µs per call by kernel kind (decode / combine / other), from a profiler trace of eager calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    shares = {"decode": 0.0, "combine": 0.0, "other": 0.0}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0.0)
        if not us or e.key.startswith(("cudaLaunch", "cuLaunch", "cudaGraph")):
            continue
        name = e.key.lower()
        kind = "combine" if "combine" in name else "decode" if ("mla" in name or "decode" in name) else "other"
        shares[kind] += us / reps
    return {k: round(v, 2) for k, v in shares.items()}


def sweep_point(bench: DecodeBench, impl, kind: str, batch: int, heads: int, q_len: int, ctx: int) -> list[dict]:
    """Each split count (and, when split, each combine variant) on one point, the same inputs throughout."""
    from lightspeed_mla import decode

    chosen_variant = decode.COMBINE_VARIANT
    cache, page_table, qsl, lens, q, out = bench.point(kind, batch, heads, q_len, ctx, seed=7)
    default = impl.plan(bench.ws, qsl, lens, heads, page_size=bench.page_size, softmax_scale=SCALE,
                        cache_kind=kind).num_splits
    cost = decode_cost(kind, batch, heads, q_len, ctx, cache.bytes_per_token)
    rows, ref = [], None
    for splits in candidate_splits(default, ctx):
        plan = impl.plan(bench.ws, qsl, lens, heads, page_size=bench.page_size, softmax_scale=SCALE,
                         cache_kind=kind, num_splits=splits)

        def call(plan=plan):
            impl.run(plan, q, cache, page_table, out)

        for variant in decode.COMBINE_VARIANTS if splits > 1 else ("-",):
            decode.COMBINE_VARIANT = variant if variant != "-" else decode.COMBINE_VARIANT
            us = _time_us(call)
            got = out.float().clone()
            ref = got if ref is None else ref
            err = ((got - ref).norm() / ref.norm()).item()
            rows.append({"kind": kind, "batch": batch, "heads": heads, "q_len": q_len, "ctx": ctx,
                         "splits": plan.num_splits, "planner": plan.num_splits == default, "combine": variant,
                         "us": round(us, 2), "of_roofline": round(cost["roofline_us"] / us, 3),
                         "roofline_us": round(cost["roofline_us"], 2), "eager_us": kernel_shares(call),
                         "err_vs_first": round(err, 5)})
    decode.COMBINE_VARIANT = chosen_variant
    return rows


def write_markdown(result: dict, path: Path) -> None:
    lines = [f"# {result['kernel']} split-KV sweep on {result['device']}", "",
             f"commit {result['commit']}, torch {result['torch']}. µs: CUDA-graph replays, L2 flushed; "
             "decode / combine µs: eager calls under torch.profiler (L2 warm). * = the planner's count.", "",
             "| kv | batch | heads | q_len | ctx | splits | combine | µs | of roofline | decode µs | combine µs | err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        e = r["eager_us"]
        lines.append(f"| {r['kind']} | {r['batch']} | {r['heads']} | {r['q_len']} | {r['ctx']} | "
                     f"{r['splits']}{' *' if r['planner'] else ''} | {r['combine']} | {r['us']} | {r['of_roofline']} | "
                     f"{e['decode']} | {e['combine']} | {r['err_vs_first']} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--kernel", default="mla_decode_sm90", help="an mla/decode kernel with plan / run")
    ap.add_argument("--points", default="b1,b4,b8,b16,b1q1,b16q1_16k")
    ap.add_argument("--kinds", default="bf16,fp8")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    import lightspeed_kernel as lk

    name = args.kernel
    chosen = lk.select_kernel("mla", "decode", torch.bfloat16, platform=lk.platform_of(torch.device("cuda")),
                              override=name, traits={"page_size": 64})
    impl, kinds = chosen.impl, chosen.spec.traits.get("kv_dtype") or ("bf16", "fp8")
    points = [POINTS[p] for p in args.points.split(",")]
    bench = DecodeBench(max(b * ctx for b, _, _, ctx in points) + (1 << 16))
    rows = []
    for kind in args.kinds.split(","):
        if kind not in kinds:  # e.g. the FP8-only mla_decode_sm90_fp8qk on bf16
            continue
        for b, h, ql, ctx in points:
            rows += sweep_point(bench, impl, kind, b, h, ql, ctx)
            print(json.dumps(rows[-1]), flush=True)
    result = {"kernel": name, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "commit": args.commit or _git_commit(), "rows": rows}
    stem = result_stem(args.out, "mla_splits", result["device"])
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    write_markdown(result, stem.with_suffix(".md"))
    print(f"wrote {stem}.{{json,md}}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
