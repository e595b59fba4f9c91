#!/usr/bin/env python
"""Tensor / expert parallelism on one multi-GPU host, through the real engine (`lightspeed.LLM`: the
engine core, its rank processes over NCCL, overlap scheduling, CUDA graphs), one layout after the
other. Per layout: load time, decode tok/s of one stream (step time = (time for N tokens - time for
1 token) / (N - 1)) and output tok/s with 32 and 128 concurrent requests (1024 prompt tokens, 128
output tokens). (Dummy weights are drawn per shard, so layouts run different random weights: the
token-for-token equality of layouts is the GPU tests' job, engine/tests/test_gpu_distributed.py.)

    python tools/bench/parallel_gpu.py --out bench/results                          # 2+ GPUs, < 10 min
    python tools/bench/parallel_gpu.py --model qwen3-30b-a3b --layouts tp1,tp2,ep2 --out bench/results
    python tools/bench/parallel_gpu.py --model tiny-qwen3-moe --device cpu --dtype float32 \
        --layouts tp1,tp2,ep2 --batches 2 --input-len 32 --output-len 8 --decode-len 8 --out /tmp/x  # CPU smoke run

Layouts: tpN (tensor parallel N), epN (N ranks, experts whole: --enable-expert-parallel), spN (tpN
with a sequence-sharded residual stream), epspN.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import subprocess
import time
from pathlib import Path

import numpy as np


def layout_args(name: str) -> dict:
    match = re.fullmatch(r"(tp|ep|sp|epsp)(\d+)", name)
    if not match:
        raise SystemExit(f"unknown layout {name!r} (tpN, epN, spN, epspN)")
    kind, ranks = match.group(1), int(match.group(2))
    return {"tensor_parallel_size": ranks, "enable_expert_parallel": kind in ("ep", "epsp"),
            "enable_sequence_parallel": kind in ("sp", "epsp")}


def run_layout(args, name: str, rng: np.random.Generator) -> dict:
    from lightspeed import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(args.model, load_format="dummy", dtype=args.dtype, device=args.device, tokenizer=args.tokenizer,
              max_model_len=args.input_len + max(args.output_len, args.decode_len) + 16,
              max_num_seqs=max(args.batches), **layout_args(name))
    row = {"layout": name, "load_s": round(time.perf_counter() - started, 1)}
    try:
        vocab = llm.engine.engine_info.vocab_size

        def prompts(count: int) -> list[list[int]]:
            return [rng.integers(10, vocab - 10, args.input_len).tolist() for _ in range(count)]

        def timed(batch: list[list[int]], tokens: int) -> tuple[float, list]:
            params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
            start = time.perf_counter()
            outs = llm.generate(batch, params)
            return time.perf_counter() - start, outs

        single = prompts(1)
        timed(single, 4)  # warm-up: kernels compile, graphs are already captured
        one, _ = timed(single, 1)
        full, _ = timed(single, args.decode_len)
        step = (full - one) / (args.decode_len - 1)
        row.update(decode_step_ms=round(step * 1e3, 3), single_stream_tok_s=round(1 / step, 1))
        for batch in args.batches:
            elapsed, outs = timed(prompts(batch), args.output_len)
            made = sum(len(o.outputs[0].token_ids) for o in outs)
            row[f"c{batch}_output_tok_s"] = round(made / elapsed, 1)
    finally:
        llm.shutdown()
    return row


def device_name(device: str) -> str:
    if device == "cpu":
        return platform.processor() or "cpu"
    import torch

    return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="preset or config.json (dummy weights)")
    p.add_argument("--layouts", default="tp1,tp2", help="comma-separated: tp1,tp2,tp4,ep2,...")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tokenizer", default=None, help="any tokenizer folder (token-id prompts need none)")
    p.add_argument("--batches", default="32,128", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--decode-len", type=int, default=64)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    rows = [run_layout(args, name, np.random.default_rng(0)) for name in args.layouts.split(",")]
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H%M")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"model": args.model, "dtype": args.dtype, "device": device_name(args.device), "commit": commit,
              "date": stamp, "input_len": args.input_len, "output_len": args.output_len, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"parallel_{stamp}_{args.device}"
    base.with_suffix(".json").write_text(json.dumps(report, indent=2))
    cols = ["layout", "load_s", "decode_step_ms", "single_stream_tok_s",
            *[f"c{b}_output_tok_s" for b in args.batches]]
    lines = [f"# Parallel layouts, {args.model} ({args.dtype}, dummy weights), {report['device']}, commit {commit}",
             "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
