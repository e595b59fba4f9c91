#!/usr/bin/env python
"""SmolLM2-135M-Instruct (the default model's GGUF, fp32) on this CPU: Lightspeed vs transformers.

Measures, in one run and interleaved so machine load hits both alike:
  - single-stream decode tok/s: Lightspeed (LLM -> engine core process, streamed token timestamps)
    vs transformers `generate` (decode rate = (N - 1) / (T(N new tokens) - T(1 new token)));
  - aggregate output tok/s of Lightspeed with 16 concurrent requests (wall clock, prefill included).
Targets: single stream >= 1.2x transformers; 16 streams >= 8x transformers' single stream.

    python tools/bench/engine_cpu.py --out bench/results                    # fp32, 1 thread each
    python tools/bench/engine_cpu.py --dtype bfloat16 --out bench/results   # both sides in bf16
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

import torch

PROMPTS = ["Explain how a hash map works.", "Write a short poem about autumn leaves.",
           "What are the benefits of unit testing?", "Describe the water cycle.",
           "Give three tips for writing clean code.", "Summarise the plot of Romeo and Juliet.",
           "How does a CPU cache improve performance?", "What is the difference between TCP and UDP?"]


def engine_single(llm, prompt_ids: list[int], n: int) -> float:
    from lightspeed import RequestOutputKind, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    stamps, count = [], 0
    for out in llm.generate_stream({"prompt_token_ids": prompt_ids}, params):
        count += len(out.outputs[0].token_ids)
        stamps.append((time.perf_counter(), count))
    (t_first, c_first), (t_last, c_last) = stamps[0], stamps[-1]
    return (c_last - c_first) / (t_last - t_first)


def engine_concurrent(llm, prompts: list[list[int]], n: int) -> dict:
    from lightspeed import RequestOutputKind, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    engine = llm.engine

    async def run():
        async def one(ids):
            async for out in engine.generate({"prompt_token_ids": ids}, params):
                last = out
            return len(last.outputs[0].token_ids)
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one(p) for p in prompts))
        return sum(counts), time.perf_counter() - t0

    total, wall = llm._call(run())
    return {"output_tokens": total, "wall_s": wall, "output_tok_s": total / wall}


def load_transformers_gguf(path: str):
    """transformers' model from the GGUF through transformers' own reader (no `accelerate` needed)."""
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
    return model.eval()


@torch.inference_mode()
def hf_single(model, prompt_ids: list[int], n: int) -> float:
    ids = torch.tensor([prompt_ids])

    def timed(k: int) -> float:
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k,
                       do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    t_one = timed(1)
    t_full = timed(n)
    return (n - 1) / (t_full - t_one)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of each side (engine core, transformers); 1 keeps OpenMP from spinning "
                        "against the other process on a shared 2-core machine")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="both engines' dtype")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()

    from lightspeed import LLM, default_model

    torch.set_num_threads(args.threads)
    path = Path(default_model())
    llm = LLM(str(path), dtype=args.dtype, kv_cache_memory="512MiB", max_model_len=2048,
              max_num_seqs=args.concurrency, num_threads=args.threads)
    hf = load_transformers_gguf(str(path)).to(getattr(torch, args.dtype))
    chat = [llm.engine.apply_chat_template([{"role": "user", "content": q}]) for q in PROMPTS]
    prompts = [chat[i % len(chat)] for i in range(args.concurrency)]
    engine_one, hf_one, conc = [], [], []
    engine_single(llm, chat[0], 8)  # warm-up both
    hf_single(hf, chat[0], 4)
    for rep in range(args.reps):
        hf_one.append(hf_single(hf, chat[rep % len(chat)], args.tokens))
        engine_one.append(engine_single(llm, chat[rep % len(chat)], args.tokens))
        conc.append(engine_concurrent(llm, prompts, args.tokens))
        print(f"rep {rep}: transformers {hf_one[-1]:.1f} tok/s | lightspeed {engine_one[-1]:.1f} tok/s | "
              f"lightspeed x{args.concurrency} {conc[-1]['output_tok_s']:.1f} tok/s", flush=True)
    llm.shutdown()

    hf_med, eng_med = statistics.median(hf_one), statistics.median(engine_one)
    conc_med = statistics.median(c["output_tok_s"] for c in conc)
    load = os.getloadavg()
    report = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": args.threads, "loadavg_after": load},
        "dtype": args.dtype,
        "model": f"{path.name} (dequantised to {args.dtype})", "output_tokens": args.tokens, "reps": args.reps,
        "transformers_single_tok_s": hf_one, "lightspeed_single_tok_s": engine_one,
        "lightspeed_concurrent": conc, "concurrency": args.concurrency,
        "median": {"transformers_single_tok_s": hf_med, "lightspeed_single_tok_s": eng_med,
                   "lightspeed_concurrent_tok_s": conc_med},
        "ratios": {"single_vs_transformers": eng_med / hf_med, "concurrent_vs_transformers_single": conc_med / hf_med},
        "targets": {"single_vs_transformers": 1.2, "concurrent_vs_transformers_single": 8.0},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"engine_cpu_{dt.date.today().isoformat()}_{args.dtype}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    r = report["ratios"]
    md = [f"# Lightspeed engine on CPU ({report['date']})", "",
          f"{report['model']}, {os.cpu_count()} cores, {args.threads} torch threads each, torch {torch.__version__}, greedy, {args.tokens} output tokens, "
          f"median of {args.reps} interleaved reps; load average after the run {load[0]:.1f} (shared machine).", "",
          "| measure | tok/s | ratio | target |", "|---|---|---|---|",
          f"| transformers generate, single stream (decode) | {hf_med:.1f} | 1.00 | |",
          f"| lightspeed, single stream (decode) | {eng_med:.1f} | {r['single_vs_transformers']:.2f}x | >= 1.2x |",
          f"| lightspeed, {args.concurrency} concurrent (aggregate output, prefill included) | {conc_med:.1f} | "
          f"{r['concurrent_vs_transformers_single']:.2f}x | >= 8x |", ""]
    stem.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
