"""Prefix-cache eviction policies under a closed loop of agentic conversations, on the scheduler alone (CPU).

The served agentic workload at a concurrency whose KV outgrows device + host (agentic c = 32 on an 80 GB H100:
~870K tokens of working set against 455K device + 254K host tokens) is replayed against `lightspeed_scheduler`
with no model: each conversation's next turn (history + 200 output + 800 new tokens) is submitted as its last
one finishes, copies land `--ack-plans` plans after theirs, and finished conversations are replaced until
`--conversations` have run. Reported per `eviction_policy`: the prefix-hit fraction of all prompt tokens (what
the GPU does not prefill again), the prompt tokens left to prefill, plans, and scheduler CPU per plan. The
scheduler does not model time, so this compares what each policy leaves to compute, not tokens per second.

    python tools/bench/scheduler_eviction.py --out bench/results          # ~1 minute on a CPU
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from lightspeed_scheduler import RequestSpec, Scheduler, SchedulerConfig
from result_files import git_commit, result_stem

# (device pages, host pages) of 16 tokens: the 8B shape's KV on an 80 GB H100 as served on 2026-12-07
# (bench/results/h100_vs_vllm_2026-12-07_1650/), half of each, and the H200 memory-pressure run's
# --kv-cache-memory 12GiB / --host-cache-memory 64GiB (bench/results/memory_pressure_h200_2026-12-01_1819/;
# run it with --concurrency 16 --conversations 16), and the 80 GB H100 with the default host tier sized since
# 2026-12-08 (2x the device pool within 3/4 of free RAM: ~86 GiB of the 128 GiB host, 44,000 pages).
SHAPES = {"h100_80gb": (28400, 15900), "half": (14200, 7950), "h200_pressure": (6144, 28672),
          "h100_80gb_hicache": (28400, 44000)}


def run(policy: str, device_pages: int, host_pages: int, args: argparse.Namespace) -> dict:
    rng = np.random.default_rng(args.seed)
    s = Scheduler(SchedulerConfig(
        page_size=16, num_device_pages=device_pages, num_host_pages=host_pages, max_num_seqs=64,
        max_num_batched_tokens=8192, chunked_prefill_size=8192, max_model_len=65536, async_copies=True,
        max_write_through_pages=args.write_through_pages, eviction_policy=policy))
    system = rng.integers(3, 30000, 2000).tolist()
    history: dict[int, list[int]] = {}
    turns: dict[int, int] = {}
    live: dict[int, int] = {}
    unacked: list[tuple[int, int]] = []

    def submit(c: int) -> None:
        live[s.submit(RequestSpec(rid=f"c{c}t{turns[c]}", token_ids=history[c], max_new_tokens=200,
                                  ignore_eos=True))] = c

    def start(c: int) -> None:
        history[c], turns[c] = system + rng.integers(3, 30000, 20000).tolist(), 0
        submit(c)

    for c in range(args.concurrency):
        start(c)
    cpu = 0.0
    plans = 0
    while live:
        t0 = time.perf_counter()
        plan = s.next_plan()
        cpu += time.perf_counter() - t0
        if plan.has_copies:
            unacked.append((plans, plan.step_id))
        while unacked and unacked[0][0] <= plans - args.ack_plans:
            s.copies_done(unacked.pop(0)[1])
        sampled = rng.integers(3, 30000, plan.num_samples).astype(np.int32)
        t0 = time.perf_counter()
        finished = list(s.advance(plan, sampled))
        cpu += time.perf_counter() - t0
        plans += 1
        for req_id, _ in finished:
            c = live.pop(req_id)
            history[c] += s.output_token_ids(req_id) + rng.integers(3, 30000, 800).tolist()
            turns[c] += 1
            if turns[c] < 6:
                submit(c)
            elif len(history) < args.conversations:
                start(len(history))
    stats = s.stats()
    s.check_invariants()
    return {"policy": policy, "device_pages": device_pages, "host_pages": host_pages, "plans": plans,
            "prompt_tokens": stats["prefix_query_tokens"], "hit_tokens": stats["prefix_hit_tokens"],
            "hit_fraction": stats["prefix_hit_tokens"] / stats["prefix_query_tokens"],
            "tokens_to_prefill": stats["prefix_query_tokens"] - stats["prefix_hit_tokens"],
            "host_hit_tokens": stats["host_hit_tokens"], "scheduler_us_per_plan": 1e6 * cpu / plans}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32, help="conversations in the loop at once")
    ap.add_argument("--conversations", type=int, default=64, help="conversations in all (6 turns each)")
    ap.add_argument("--write-through-pages", type=int, nargs="+", default=[256, 4096],
                    help="max_write_through_pages values (the engine's: 512 MiB / 2 MiB pages = 256)")
    ap.add_argument("--ack-plans", type=int, default=2, help="plans after which a plan's copies land")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="folder for scheduler_eviction_<date-time>_<cpu>.json/.md")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes:
        for pages in args.write_through_pages:
            for policy in ("lru", "queue"):
                ns = argparse.Namespace(**{**vars(args), "write_through_pages": pages})
                row = {"shape": shape, "write_through_pages": pages, **run(policy, *SHAPES[shape], ns)}
                rows.append(row)
                print(f"{shape:10s} wt {pages:5d} {policy:5s}  hit {row['hit_fraction']:.3f}  to prefill "
                      f"{row['tokens_to_prefill'] / 1e6:6.2f}M tokens  plans {row['plans']:6d}  "
                      f"{row['scheduler_us_per_plan']:6.0f} us/plan", flush=True)
    if args.out:
        stem = result_stem(args.out, "scheduler_eviction")
        meta = {"commit": git_commit(), "args": {k: v for k, v in vars(args).items() if k != "out"}}
        stem.with_suffix(".json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        lines = [f"# Eviction policies, closed loop on the scheduler (commit {meta['commit']})", "",
                 "| shape | write-through pages | policy | hit fraction | tokens to prefill | plans | us / plan |",
                 "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['shape']} | {r['write_through_pages']} | {r['policy']} | {r['hit_fraction']:.3f} | "
                  f"{r['tokens_to_prefill']:,} | {r['plans']} | {r['scheduler_us_per_plan']:.0f} |" for r in rows]
        stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print(f"wrote {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
