#!/usr/bin/env python
"""SmolLM2-135M-Instruct (the default model's GGUF) on this CPU: Lightspeed vs transformers, one run.

For transformers (the GGUF dequantised to --dtype, through its own GGUF reader) and for Lightspeed
under each weight scheme of --schemes (none = dequantised at load; int8, int4, gguf = weight-only
quantised on the native CPU kernels), measured in the same process and interleaved rep by rep, so
machine load hits every side alike:
  - single-stream decode tok/s (Lightspeed: streamed token timestamps; transformers: `generate`,
    (N - 1) / (T(N new tokens) - T(1 new token)));
  - aggregate output tok/s of Lightspeed with --concurrency requests (wall clock, prefill included);
  - TTFT of a --prompt-tokens prompt (one request, one output token);
  - resident memory: Lightspeed's engine core process (torch runtime, weights, a --kv-cache-memory
    KV cache), transformers' growth of this process while loading its model (weights only);
  - greedy agreement with the fp32 path (scheme none) over the first --parity-tokens tokens of the
    parity prompts (test/test_smollm2_vs_transformers.py), and the CPU default rule: the fastest
    scheme whose greedy output matches fp32 on every prompt, else the closest.
Every figure carries the 1-minute load average at its measurement (the machine may be shared).

    python tools/bench/engine_cpu.py --out bench/results                  # threads = physical cores
    python tools/bench/engine_cpu.py --threads 1 --schemes none,gguf --out bench/results
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import statistics
import time
from pathlib import Path

import psutil
import torch
from result_files import git_commit, result_stem

PROMPTS = ["Explain how a hash map works.", "Write a short poem about autumn leaves.",
           "What are the benefits of unit testing?", "Describe the water cycle.",
           "Give three tips for writing clean code.", "Summarise the plot of Romeo and Juliet.",
           "How does a CPU cache improve performance?", "What is the difference between TCP and UDP?"]
PARITY_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the ocean.",
                  "List three primary colors:", "In 1969, Neil Armstrong"]


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def measured(value: float, **extra) -> dict:
    """A figure with the machine's 1-minute load average when it was taken."""
    return {"value": value, "load1": load1(), **extra}


# -- Lightspeed ---------------------------------------------------------------------------------------

def engine_single(llm, prompt_ids: list[int], n: int) -> float:
    from lightspeed import RequestOutputKind, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    stamps, count = [], 0
    for out in llm.generate_stream({"prompt_token_ids": prompt_ids}, params):
        count += len(out.outputs[0].token_ids)
        stamps.append((time.perf_counter(), count))
    (t_first, c_first), (t_last, c_last) = stamps[0], stamps[-1]
    return (c_last - c_first) / (t_last - t_first)


def engine_ttft(llm, prompt_ids: list[int]) -> float:
    from lightspeed import SamplingParams

    start = time.perf_counter()
    for _ in llm.generate_stream({"prompt_token_ids": prompt_ids}, SamplingParams(temperature=0.0, max_tokens=1)):
        break
    return time.perf_counter() - start


def engine_concurrent(llm, prompts: list[list[int]], n: int) -> float:
    from lightspeed import RequestOutputKind, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)

    async def run():
        async def one(ids):
            async for out in llm.engine.generate({"prompt_token_ids": ids}, params):
                last = out
            return len(last.outputs[0].token_ids)
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(p) for p in prompts))
        return sum(counts) / (time.perf_counter() - t0)

    return llm._call(run())


def engine_greedy(llm, prompts: list[list[int]], n: int) -> list[list[int]]:
    from lightspeed import SamplingParams

    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


# -- transformers -------------------------------------------------------------------------------------

def load_transformers_gguf(path: str, dtype: torch.dtype):
    """transformers' model from the GGUF through its own reader (no `accelerate` needed)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    p = Path(path)
    config = AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(p), return_tensors=True, model_to_load=skeleton)["tensors"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(tensors, strict=False)
    model.tie_weights()
    return model.to(dtype).eval()


@torch.inference_mode()
def hf_generate_s(model, prompt_ids: list[int], k: int) -> float:
    ids = torch.tensor([prompt_ids])
    t0 = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k, do_sample=False,
                   pad_token_id=0)
    return time.perf_counter() - t0


def hf_single(model, prompt_ids: list[int], n: int) -> float:
    return (n - 1) / (hf_generate_s(model, prompt_ids, n) - hf_generate_s(model, prompt_ids, 1))


# -- the run ------------------------------------------------------------------------------------------

def agreement(got: list[list[int]], reference: list[list[int]]) -> list[int]:
    """Leading tokens equal to the reference, per prompt."""
    return [next((i for i, (a, b) in enumerate(zip(g, r, strict=False)) if a != b), min(len(g), len(r)))
            for g, r in zip(got, reference, strict=True)]


def long_prompt(tokenizer, n: int) -> list[int]:
    text = " ".join(f"Paragraph {i}: {PROMPTS[i % len(PROMPTS)]} The answer should be careful and complete."
                    for i in range(n // 8))
    ids = list(tokenizer(text, add_special_tokens=False).input_ids)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def run_scheme(scheme: str, args, path: Path, chat, long_ids, parity, hf, hf_rows) -> dict:
    from lightspeed import LLM

    llm = LLM(str(path), dtype=args.dtype, quantization=scheme, kv_cache_memory=args.kv_cache_memory,
              host_cache_memory=0,
              max_model_len=max(2048, args.prompt_tokens + 64), max_num_seqs=args.concurrency,
              num_threads=args.threads)
    try:
        row = {"scheme": scheme, "greedy": engine_greedy(llm, parity, args.parity_tokens)}
        engine_single(llm, chat[0], 8)  # warm-up
        row["single"], row["concurrent"], row["ttft_s"], row["ttft_paired_ratio"] = [], [], [], []
        prompts = [chat[i % len(chat)] for i in range(args.concurrency)]
        for rep in range(args.reps):
            hf_rows["single"].append(measured(hf_single(hf, chat[rep % len(chat)], args.tokens), before=scheme))
            row["single"].append(measured(engine_single(llm, chat[rep % len(chat)], args.tokens)))
            row["concurrent"].append(measured(engine_concurrent(llm, prompts, args.tokens)))
            if rep < args.ttft_reps:
                # A prompt of its own per rep (rotated), or the engine's prefix cache would answer the
                # second; each side's time is paired with the other's, taken just before it.
                prompt = long_ids[rep:] + long_ids[:rep]
                hf_rows["ttft_s"].append(measured(hf_generate_s(hf, prompt, 1), before=scheme))
                row["ttft_s"].append(measured(engine_ttft(llm, prompt)))
                row["ttft_paired_ratio"].append(row["ttft_s"][-1]["value"] / hf_rows["ttft_s"][-1]["value"])
            print(f"[{scheme}] rep {rep}: transformers {hf_rows['single'][-1]['value']:.1f} tok/s | lightspeed "
                  f"{row['single'][-1]['value']:.1f} tok/s | x{args.concurrency} {row['concurrent'][-1]['value']:.1f}"
                  f" tok/s | load {load1()}", flush=True)
        row["rss_mib"] = measured(psutil.Process(llm.engine.engine_pid).memory_info().rss / 2**20)
    finally:
        llm.shutdown()
    return row


def median(rows: list[dict]) -> float:
    return statistics.median(r["value"] for r in rows) if rows else float("nan")


def summarise(report: dict) -> None:
    """Medians, ratios, parity agreement and the default rule's choice, into `report`."""
    hf = report["transformers"]
    hf["median"] = {"single": median(hf["single"]), "ttft_s": median(hf["ttft_s"])}
    reference = next((r["greedy"] for r in report["lightspeed"] if r["scheme"] == "none"), None)
    for row in report["lightspeed"]:
        row["median"] = {k: median(row[k]) for k in ("single", "concurrent", "ttft_s")}
        row["ratios"] = {"single_vs_transformers": row["median"]["single"] / hf["median"]["single"],
                         "concurrent_vs_own_single": row["median"]["concurrent"] / row["median"]["single"],
                         "concurrent_vs_transformers_single": row["median"]["concurrent"] / hf["median"]["single"],
                         "ttft_vs_transformers": row["median"]["ttft_s"] / hf["median"]["ttft_s"],
                         "ttft_paired_vs_transformers": (statistics.median(row["ttft_paired_ratio"])
                                                         if row["ttft_paired_ratio"] else float("nan"))}
        if reference is not None:
            row["agreement"] = agreement(row["greedy"], reference)
    rows = [r for r in report["lightspeed"] if "agreement" in r]
    n = report["parity_tokens"]
    exact = [r for r in rows if min(r["agreement"]) >= n]
    pool = exact or sorted(rows, key=lambda r: -sum(r["agreement"]))[:1]
    if pool:
        best = max(pool, key=lambda r: r["median"]["single"])
        report["default_rule"] = {"chosen": best["scheme"], "all_prompts_match": bool(exact),
                                  "rule": f"fastest single-stream scheme whose greedy output equals the fp32 path's "
                                          f"over the first {n} tokens of every parity prompt, else the closest"}


def markdown(report: dict) -> str:
    m, hf = report["machine"], report["transformers"]
    lines = [f"# Lightspeed engine on CPU ({report['date']}, commit {report['commit']})", "",
             f"{report['model']}; {m['cpu']}, {m['cores']} cores ({m['physical_cores']} physical), "
             f"{report['threads']} torch threads each side, torch {report['torch']}, activations {report['dtype']}, "
             f"greedy, {report['output_tokens']} output tokens, median of {report['reps']} interleaved reps "
             f"(TTFT: {report['ttft_reps']}). Load average (1 min) at start {m['load1_start']}, at end "
             f"{m['load1_end']}; each figure's own is in the JSON. The machine is shared: other processes ran.",
             "", "TTFT vs transformers: ratio of the medians, and (paired) the median of each rep's ratio to "
             "transformers' TTFT taken just before it on the same prompt (less exposed to load swings).",
             "", f"RSS: Lightspeed's engine core process (torch runtime, weights, a {report['kv_cache_memory']} KV "
             "cache); transformers: what loading its model added to this process (weights only).", "",
             "| side | single stream tok/s | vs transformers | "
             f"{report['concurrency']} streams tok/s | vs own single | TTFT {report['prompt_tokens']} tok (s) | "
             f"vs transformers | RSS MiB | parity (tokens equal to fp32, per prompt) |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| transformers ({report['dtype']}, dequantised) | {hf['median']['single']:.1f} | 1.00 | | | "
             f"{hf['median']['ttft_s']:.2f} | 1.00 | {hf['rss_mib']['value']:.0f} | |"]
    for row in report["lightspeed"]:
        med, r = row["median"], row["ratios"]
        parity = "/".join(str(a) for a in row.get("agreement", [])) or "-"
        lines.append(f"| lightspeed {row['scheme']} | {med['single']:.1f} | {r['single_vs_transformers']:.2f}x | "
                     f"{med['concurrent']:.1f} | {r['concurrent_vs_own_single']:.2f}x | {med['ttft_s']:.2f} | "
                     f"{r['ttft_vs_transformers']:.2f}x (paired {r['ttft_paired_vs_transformers']:.2f}x) | "
                     f"{row['rss_mib']['value']:.0f} | {parity} |")
    rule = report.get("default_rule")
    if rule:
        lines += ["", f"Default rule ({rule['rule']}): **{rule['chosen']}**"
                  + ("" if rule["all_prompts_match"] else " (no scheme matched on every prompt: the closest)") + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ttft-reps", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=2048, help="prompt length of the TTFT measurement")
    p.add_argument("--parity-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None, help="torch threads of each side (default: physical cores)")
    p.add_argument("--schemes", default="none,int8,int4,gguf", help="Lightspeed weight schemes to measure")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="activation dtype, both sides")
    p.add_argument("--kv-cache-memory", default="256MiB", help="Lightspeed's KV cache (part of its RSS)")
    p.add_argument("--tag", default="", help="suffix of the result file names")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()

    from lightspeed import apply_chat_template, default_model, load_tokenizer
    from lightspeed.runner.factory import default_cpu_threads

    args.threads = args.threads or default_cpu_threads()
    torch.set_num_threads(args.threads)
    path = Path(default_model())
    import transformers  # noqa: F401  (imported before the RSS baseline: only the model counts)

    start_load, rss_before = load1(), psutil.Process().memory_info().rss
    hf = load_transformers_gguf(str(path), getattr(torch, args.dtype))
    hf_rows = {"single": [], "ttft_s": [], "rss_mib": measured((psutil.Process().memory_info().rss - rss_before) / 2**20)}
    tokenizer = load_tokenizer(str(path))
    chat = [apply_chat_template(tokenizer, [{"role": "user", "content": q}]) for q in PROMPTS]
    parity = [apply_chat_template(tokenizer, [{"role": "user", "content": q}]) for q in PARITY_PROMPTS]
    long_ids = long_prompt(tokenizer, args.prompt_tokens)
    hf_single(hf, chat[0], 4)  # warm-up
    rows = [run_scheme(s, args, path, chat, long_ids, parity, hf, hf_rows) for s in args.schemes.split(",")]
    now = dt.datetime.now(dt.timezone.utc)
    report = {
        "date": now.isoformat(timespec="seconds"), "commit": git_commit(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "physical_cores": psutil.cpu_count(logical=False), "load1_start": start_load,
                    "load1_end": load1()},
        "model": path.name, "torch": torch.__version__, "dtype": args.dtype, "threads": args.threads,
        "output_tokens": args.tokens, "reps": args.reps, "ttft_reps": args.ttft_reps,
        "prompt_tokens": args.prompt_tokens, "parity_tokens": args.parity_tokens, "concurrency": args.concurrency,
        "kv_cache_memory": args.kv_cache_memory,
        "transformers": hf_rows, "lightspeed": rows,
    }
    summarise(report)
    name = f"engine_cpu_t{args.threads}{'_' + args.tag if args.tag else ''}"
    stem = result_stem(args.out, name)  # <name>_<UTC date-time>_<cpu>: never overwrites an earlier run
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    stem.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
