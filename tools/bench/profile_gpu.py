#!/usr/bin/env python
"""Where a step's GPU time goes: the real engine (`lightspeed.core.engine.Engine`, its overlapped step
loop and CUDA graphs) driven in-process under the torch profiler, one scenario at a time.

Scenarios (Llama-3.1-8B-shaped dummy by default):
  decode_b1    batch-1 decode steps at 1K context (the served TPOT at concurrency 1)
  decode_b32   32 requests decoding at 1K context
  decode_b64   64 requests decoding at 1K context (max_num_seqs: the served random c = 128 steps)
  prefill_20k  a 20K-token first turn (8192-token chunks), no cached prefix
  turn_800     an agentic turn: 800 new tokens over the 20K-token prefix just computed
  mixed_16     a 20K-token first turn chunked beside 16 requests decoding at 12K context (distinct
               prompts): the steps of an agentic c = 16 sweep while a conversation starts
  mixed_63     a 1K-token prompt beside 63 requests decoding at 1K context: the served random 1024/128
               c = 128 step at max_num_seqs 64 (one admission a step)
  churn_128    the served random 1024/128 sweep at c = 128 in process: 128 requests outstanding (64 running,
               64 waiting), each finished one replaced by a fresh prompt at once; stepped unprofiled until the
               admissions reach a steady mix, timed unprofiled (output tokens/s, ms/step: the figures to set
               beside the served run's), then profiled for the breakdown. Not run by default (long).
For each: wall time per step, GPU busy (union of kernel intervals / wall; again without host transfers,
which run on the copy engines beside the kernels), and kernel time by
category (gemm, attention, norm/rope/kv-store/activation, sampling, copies, other) and by kernel,
in a markdown table; the JSON holds the top kernels. Chrome traces are written with --trace.

    python tools/bench/profile_gpu.py --out bench/results                  # on the H200, ~2 minutes
    python tools/bench/profile_gpu.py --model tiny-llama --device cpu --out /tmp/x --smoke   # CPU check
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from result_files import git_commit, result_stem

CATEGORIES = [  # first match wins; kernel names lower-cased
    # Copy-engine transfers to or from host memory (the KV host tier's write-through and load-back run on
    # their own stream): they take PCIe bandwidth and a little HBM, not SMs.
    ("host transfer", ("memcpy dtoh", "memcpy htod", "memcpy ptoh", "memcpy htop")),
    ("attention", ("prefill_kernel", "decode_kernel", "combine_kernel", "flash", "attn", "fmha", "mla")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "cublas", "matmul", "splitk")),
    ("sampling", ("sample", "topk", "logsumexp", "penalt", "argmax", "softmax")),
    ("norm/rope/kv/act", ("rms_norm", "rope", "store_kv", "act_and_mul", "silu", "rotate")),
    ("copy", ("memcpy", "memset", "copy", "fill", "index", "gather", "scatter", "cat")),
]


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (kernels of several streams overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def busy_split(events: list[tuple[str, float, float]]) -> tuple[float, float]:
    """(busy, compute busy) in the events' time unit, for (name, start, end) GPU events: the union of every
    interval, and of those that are not host transfers (what the SMs and device copies were doing)."""
    compute = [(s, e) for name, s, e in events if category(name) != "host transfer"]
    return busy_us([(s, e) for _, s, e in events]), busy_us(compute)


def summarise(prof, steps: int, wall_s: float) -> dict:
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_cat: dict[str, float] = defaultdict(float)
    for e in kernels:
        dur = e.time_range.end - e.time_range.start
        by_name[e.name][0] += dur
        by_name[e.name][1] += 1
        by_cat[category(e.name)] += dur
    busy, compute_busy = busy_split([(e.name, e.time_range.start, e.time_range.end) for e in kernels])
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    return {
        "steps": steps, "wall_ms": wall_s * 1e3, "wall_ms_per_step": wall_s * 1e3 / max(steps, 1),
        "gpu_busy_ms_per_step": busy / 1e3 / max(steps, 1),
        "gpu_busy_fraction": busy / 1e6 / wall_s if wall_s > 0 else float("nan"),
        "compute_busy_ms_per_step": compute_busy / 1e3 / max(steps, 1),
        "compute_busy_fraction": compute_busy / 1e6 / wall_s if wall_s > 0 else float("nan"),
        "kernels_per_step": len(kernels) / max(steps, 1),
        "by_category_ms_per_step": {k: v / 1e3 / max(steps, 1) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top_kernels": [{"name": n[:140], "ms_per_step": t / 1e3 / max(steps, 1), "calls_per_step": c / max(steps, 1)}
                        for n, (t, c) in top],
    }


def _submit(engine, m, names: list[str], prompts: list[list[int]], spec) -> None:
    for name, p in zip(names, prompts, strict=True):
        error = engine.add_request(m.AddRequest(name, p, spec))
        if error is not None:
            raise RuntimeError(f"{name} rejected: {error}")


def _step_until_decoding(engine, count: int) -> None:
    """Step (unprofiled) until `count` requests have their first token, then once more: the first step
    planned behind the last prefill may still carry its chunk."""
    started: set[str] = set()
    while len(started) < count:
        started.update(engine.step().request_ids)
    engine.step()


def _sync() -> None:
    """Wait for the GPU's queued work (a no-op without CUDA), so a wall-clock window holds what it ran."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _profiled(run_steps) -> tuple[object, int, float]:
    """(profiler, steps, wall seconds) of `run_steps()`, which steps the engine and returns its count."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        steps = run_steps()
        _sync()
        wall = time.perf_counter() - t0
    return prof, steps, wall


def _finish(engine, prof, steps: int, wall: float, name: str, prompts: int, prompt_tokens: int, trace_dir) -> dict:
    while engine.has_work() or engine.has_pending_copies():
        engine.step()
    if trace_dir is not None:
        prof.export_chrome_trace(str(trace_dir) + f"_{name}.trace.json")
    out = summarise(prof, steps, wall)
    out["prompts"], out["prompt_tokens"] = prompts, prompt_tokens
    return out


def run_scenario(engine, m, name: str, prompts: list[list[int]], max_tokens: int, decode_only: bool, trace_dir):
    """Submit prompts and profile their steps; decode_only: step unprofiled until every request has its
    first token (their prefill chunks done), so only decode steps are profiled (a prefill scenario
    profiles from its first chunk)."""
    spec = m.SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, min_tokens=max_tokens)
    _submit(engine, m, [f"{name}-{i}" for i in range(len(prompts))], prompts, spec)
    if decode_only:
        _step_until_decoding(engine, len(prompts))

    def until_idle() -> int:
        steps = 0
        while engine.has_work():
            engine.step()
            steps += 1
        return steps

    prof, steps, wall = _profiled(until_idle)
    return _finish(engine, prof, steps, wall, name, len(prompts), len(prompts[0]), trace_dir)


def run_mixed(engine, m, prompts: list[list[int]], long_prompt: list[int], trace_dir) -> dict:
    """Requests decoding (started unprofiled) while one long prompt is prefilled: profile the steps
    from its submission to its first token, then abort the decoders."""
    names = [f"mixed-decode-{i}" for i in range(len(prompts))]
    _submit(engine, m, names, prompts, m.SamplingSpec(max_tokens=100_000, temperature=0.0, ignore_eos=True))
    _step_until_decoding(engine, len(prompts))

    def until_first_token() -> int:
        _submit(engine, m, ["mixed-prefill"], [long_prompt], m.SamplingSpec(max_tokens=1, temperature=0.0))
        steps = 1
        while "mixed-prefill" not in engine.step().request_ids:
            steps += 1
        return steps

    prof, steps, wall = _profiled(until_first_token)
    engine.abort_requests(names)
    return _finish(engine, prof, steps, wall, "mixed", len(prompts) + 1, len(long_prompt), trace_dir)


def run_churn(engine, m, rand, *, prompt_len: int, out_len: int, outstanding: int, warm_steps: int,
              timed_steps: int, profiled_steps: int, trace_dir) -> dict:
    """A closed loop of `outstanding` clients, each sending a fresh random prompt as soon as its last request
    finished (lightspeed-bench's random mode): the step mix the served c = 128 level runs (decodes with an
    admission's prefill chunk beside them whenever a slot frees). The unprofiled window gives the rate; the
    profiler, which adds host time to every op, only the breakdown."""
    spec = m.SamplingSpec(max_tokens=out_len, temperature=0.0, ignore_eos=True)
    live: set[str] = set()
    submitted = 0

    def run(n: int) -> int:
        """Step n times, topping the clients up before each step; the output tokens the steps made."""
        nonlocal submitted
        tokens = 0
        for _ in range(n):
            while len(live) < outstanding:
                name = f"churn-{submitted}"
                submitted += 1
                _submit(engine, m, [name], [rand(prompt_len)], spec)
                live.add(name)
            out = engine.step()
            tokens += len(out.token_ids)
            live.difference_update(out.finished or {})
        return tokens

    def profiled_window() -> int:
        run(profiled_steps)
        return profiled_steps

    run(warm_steps)
    _sync()
    t0 = time.perf_counter()
    timed_tokens = run(timed_steps)
    _sync()
    timed_s = time.perf_counter() - t0
    prof, steps, wall = _profiled(profiled_window)
    engine.abort_requests(sorted(live))
    out = _finish(engine, prof, steps, wall, "churn", outstanding, prompt_len, trace_dir)
    out["unprofiled"] = {"steps": timed_steps, "seconds": timed_s, "ms_per_step": timed_s * 1e3 / timed_steps,
                         "output_tokens": timed_tokens, "output_tokens_per_s": timed_tokens / timed_s}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", required=True)
    ap.add_argument("--trace", action="store_true", help="also write chrome traces")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the script)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--scenarios", default=None, help="comma-separated subset (default: all)")
    args = ap.parse_args(argv)

    from lightspeed.config import EngineConfig
    from lightspeed.core import messages as m
    from lightspeed.core.engine import Engine

    small = args.smoke
    ctx, long_prompt, turn, chunk = (32, 96, 16, 64) if small else (1024, 20000, 800, 8192)
    cfg = EngineConfig(model=args.model, load_format="dummy", device=args.device,
                       max_model_len=4 * long_prompt if small else 32768, max_num_seqs=64,
                       max_num_batched_tokens=chunk, kv_cache_memory="64MiB" if small else "40GiB",
                       host_cache_memory="16MiB" if small else "1GiB")
    engine = Engine(cfg)
    vocab = min(engine.vocab_size, 32000)
    gen = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(10, vocab, (n,), generator=gen).tolist()  # noqa: E731
    stem = result_stem(args.out, "profile_gpu")
    trace = stem if args.trace else None

    results = {}
    decode_tokens = 8 if small else 64
    wanted = set(args.scenarios.split(",")) if args.scenarios else None
    on = lambda name: wanted is None or name in wanted  # noqa: E731

    # Warm every shape first (Triton compiles, CUDA graphs): one pass of each scenario unprofiled.
    warm = {"decode_b1": ([rand(ctx)], 8), "decode_b32": ([rand(ctx) for _ in range(32 if not small else 4)], 8),
            "decode_b64": ([rand(ctx) for _ in range(64 if not small else 8)], 8)}
    for name, (prompts, n) in warm.items():
        if name == "decode_b64" and not on(name):
            continue  # the largest batch warms only when profiled
        spec = m.SamplingSpec(max_tokens=n, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(prompts):
            engine.add_request(m.AddRequest(f"warm-{name}-{i}", p, spec))
        while engine.has_work() or engine.has_pending_copies():
            engine.step()
    warm_long = rand(long_prompt)
    engine.add_request(m.AddRequest("warm-long", warm_long, m.SamplingSpec(max_tokens=1, temperature=0.0)))
    engine.add_request(m.AddRequest("warm-turn", warm_long + rand(turn), m.SamplingSpec(max_tokens=1, temperature=0.0)))
    while engine.has_work() or engine.has_pending_copies():
        engine.step()

    if on("decode_b1"):
        results["decode_b1"] = run_scenario(engine, m, "decode_b1", [rand(ctx)], decode_tokens, True, trace)
    if on("decode_b32"):
        results["decode_b32"] = run_scenario(engine, m, "decode_b32", [rand(ctx) for _ in range(4 if small else 32)],
                                             decode_tokens, True, trace)
    if on("decode_b64"):
        results["decode_b64"] = run_scenario(engine, m, "decode_b64", [rand(ctx) for _ in range(8 if small else 64)],
                                             decode_tokens, True, trace)
    first = rand(long_prompt)
    if on("prefill_20k") or on("turn_800"):
        results["prefill_20k"] = run_scenario(engine, m, "prefill_20k", [first], 1, False, trace)
    if on("turn_800"):
        results["turn_800"] = run_scenario(engine, m, "turn_800", [first + rand(turn)], 1, False, trace)
    if on("mixed_16"):
        decoders = [rand(ctx if small else 12000) for _ in range(4 if small else 16)]
        results["mixed_16"] = run_mixed(engine, m, decoders, rand(long_prompt), trace)
    if on("mixed_63"):
        decoders = [rand(ctx) for _ in range(7 if small else 63)]
        results["mixed_63"] = run_mixed(engine, m, decoders, rand(ctx), trace)
    if wanted is not None and "churn_128" in wanted:
        results["churn_128"] = run_churn(
            engine, m, rand, prompt_len=ctx, out_len=8 if small else 128, outstanding=16 if small else 128,
            warm_steps=40 if small else 600, timed_steps=20 if small else 400, profiled_steps=10 if small else 100,
            trace_dir=trace)
        u = results["churn_128"]["unprofiled"]
        print(f"churn_128 unprofiled: {u['output_tokens_per_s']:.0f} output tok/s "
              f"({u['output_tokens_per_s'] * 60:.0f} tok/min), {u['ms_per_step']:.3f} ms/step", flush=True)
    for name, r in results.items():
        print(f"{name}: {r['wall_ms_per_step']:.3f} ms/step wall, GPU busy {r['gpu_busy_fraction']:.1%} "
              f"(without host transfers {r['compute_busy_fraction']:.1%}), "
              f"{r['kernels_per_step']:.0f} kernels/step, " +
              ", ".join(f"{k} {v:.3f}" for k, v in r["by_category_ms_per_step"].items()), flush=True)

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    result = {"device": device, "commit": args.commit or git_commit(), "torch": torch.__version__,
              "model": args.model, "scenarios": results}
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(to_markdown(result))
    print(f"wrote {stem}.json/.md")
    return 0


def to_markdown(result: dict) -> str:
    lines = [f"# Engine step profile, {result['device']} (model {result['model']}, commit {result['commit']}, "
             f"torch {result['torch']})", ""]
    for name, r in result["scenarios"].items():
        lines += [f"## {name}: {r['prompts']} prompt(s) of {r['prompt_tokens']} tokens, {r['steps']} steps profiled",
                  "", f"Wall {r['wall_ms']:.1f} ms in all, {r['wall_ms_per_step']:.3f} ms/step (the profiler adds host time); GPU busy {r['gpu_busy_ms_per_step']:.3f} ms/step "
                  f"({r['gpu_busy_fraction']:.1%}), without host transfers {r['compute_busy_ms_per_step']:.3f} ms/step "
                  f"({r['compute_busy_fraction']:.1%}); {r['kernels_per_step']:.0f} kernels/step.", "",
                  "| category | ms/step |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in r["by_category_ms_per_step"].items()]
        lines += ["", "| kernel | ms/step | calls/step |", "|---|---|---|"]
        lines += [f"| `{k['name'][:90]}` | {k['ms_per_step']:.3f} | {k['calls_per_step']:.1f} |" for k in r["top_kernels"][:15]]
        if "unprofiled" in r:
            u = r["unprofiled"]
            lines += ["", f"Unprofiled, {u['steps']} steps: {u['ms_per_step']:.3f} ms/step, {u['output_tokens_per_s']:.0f} "
                      f"output tokens/s ({u['output_tokens_per_s'] * 60:.0f} a minute)."]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
