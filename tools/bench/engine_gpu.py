#!/usr/bin/env python
"""The engine on a GPU, measured through the real engine (`lightspeed.LLM`: the engine core process,
its overlapped step loop, CUDA graphs), beside Hugging Face transformers on the same shapes.

Reports, in one run:
  1. decode tok/s at batch 1 and its fraction of the speed of light:
     SOL step = (weight bytes read + KV bytes read per step) / 4.27 TB/s (H200 HBM); the step time is
     (time for N tokens - time for 1 token) / (N - 1), so it holds everything a served token costs;
  2. output tok/s with 32 and 128 concurrent requests (1024 prompt tokens, 128 output tokens);
  1-2 run twice: with CUDA graphs for decode steps (the default engine) and with --enforce-eager,
     unless --enforce-eager (eager only) or --no-eager-compare (graphs only) is given;
  3. transformers `generate` (random-init LlamaForCausalLM from the same config) on the same shapes.
Registry kernels vs torch references is a GPU test (engine/tests/test_gpu_engine.py), not timed here.

    python tools/bench/engine_gpu.py --out bench/results            # on the H200, < 5 minutes
    python tools/bench/engine_gpu.py --model tiny-llama --device cpu --dtype float32 --batches 2,4 \
        --input-len 32 --output-len 8 --decode-len 8 --no-hf --out /tmp/x  # smoke run on a CPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from result_files import git_commit, result_stem

HBM_BYTES_PER_S = 4.27e12


def hf_config(model: str) -> dict:
    """The model's HF config: a preset name or a folder / config.json path."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    from lightspeed.models import preset_hf_config

    return preset_hf_config(model)


def dense_weight_bytes(cfg: dict, itemsize: int) -> int:
    """Bytes of weights one decode step reads for a dense Llama/Qwen-style model: every layer's
    projections and norms plus the LM head (the embedding table is read one row per token)."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head_dim, cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h
    return (layers * per_layer + h + cfg["vocab_size"] * h) * itemsize


def kv_bytes_per_token(cfg: dict, itemsize: int) -> int:
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim * itemsize


def run_engine(args, rng: np.random.Generator, report: dict, *, enforce_eager: bool = False, suffix: str = "") -> None:
    """Measures 1-2 into report["batch1" + suffix] / ["throughput" + suffix]."""
    from lightspeed import LLM, SamplingParams

    label = "eager" if enforce_eager else "graphs"
    llm = LLM(args.model, load_format="dummy", dtype=args.dtype, device=args.device, tokenizer=args.tokenizer,
              max_model_len=args.max_model_len, max_num_seqs=max(args.batches + [1]),
              max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
              host_cache_memory=args.host_cache_memory, enable_prefix_cache=False, page_size=args.page_size,
              enforce_eager=enforce_eager)
    try:
        info = llm.engine.engine_info
        vocab = info.vocab_size
        report["model"] = {"model": args.model, "dtype": args.dtype, "vocab": vocab,
                           "num_device_pages": info.num_device_pages, "kv_cache_dtype": info.kv_cache_dtype}

        def greedy(n: int) -> SamplingParams:
            return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)

        def timed(prompts: list[list[int]], n: int) -> tuple[float, int]:
            t0 = time.perf_counter()
            outs = llm.generate(prompts, greedy(n))
            return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

        def prompts(count: int) -> list[list[int]]:
            return [rng.integers(0, vocab, args.input_len).tolist() for _ in range(count)]

        # Warm-up: Triton JIT and the allocator on the shapes measured below.
        for batch in [1, *args.batches]:
            timed(prompts(batch), 4)

        # 1. Batch-1 decode: (N tokens - 1 token) / (N - 1), median of three.
        steps = []
        for _ in range(3):
            prompt = prompts(1)
            one, _ = timed(prompt, 1)
            full, _ = timed(prompt, args.decode_len)
            steps.append((full - one) / (args.decode_len - 1))
        step_s = float(np.median(steps))
        cfg, itemsize = hf_config(args.model), torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
        kv_itemsize = 1 if "float8" in info.kv_cache_dtype else itemsize
        avg_ctx = args.input_len + args.decode_len / 2
        bytes_per_step = dense_weight_bytes(cfg, itemsize) + avg_ctx * kv_bytes_per_token(cfg, kv_itemsize)
        sol_s = bytes_per_step / HBM_BYTES_PER_S
        report["batch1" + suffix] = {
            "decode_tok_s": 1.0 / step_s, "median_step_ms": step_s * 1e3, "steps_ms": [x * 1e3 for x in steps],
            "bytes_per_step": bytes_per_step, "speed_of_light_step_ms": sol_s * 1e3,
            "fraction_of_speed_of_light": sol_s / step_s, "prompt_len": args.input_len, "decode_len": args.decode_len}
        print(f"[{label}] batch 1: {1 / step_s:.1f} tok/s, step {step_s * 1e3:.2f} ms, SOL {sol_s * 1e3:.2f} ms "
              f"({sol_s / step_s:.1%})", flush=True)

        # 2. Concurrent requests.
        report["throughput" + suffix] = {}
        for batch in args.batches:
            wall, produced = timed(prompts(batch), args.output_len)
            report["throughput" + suffix][str(batch)] = {"output_tok_s": produced / wall, "wall_s": wall,
                                                         "output_tokens": produced}
            print(f"[{label}] {batch} concurrent: {produced / wall:.1f} output tok/s ({wall:.2f} s)", flush=True)
    finally:
        llm.shutdown()
    gc.collect()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def run_transformers(args, rng: np.random.Generator, report: dict) -> None:
    from lightspeed.models import preset_hf_config
    from transformers import LlamaConfig, LlamaForCausalLM

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hf_config = LlamaConfig(**{k: v for k, v in preset_hf_config(args.model).items() if k != "torch_dtype"})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(hf_config).eval()
    finally:
        torch.set_default_dtype(previous)
    vocab = hf_config.vocab_size

    def generate(batch: int, new_tokens: int) -> float:
        ids = torch.as_tensor(rng.integers(0, vocab, (batch, args.input_len)), device=device)
        sync(device)
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        sync(device)
        return time.perf_counter() - t0

    generate(1, 4)  # warm-up
    t_full, t_one = generate(1, args.decode_len), generate(1, 1)
    report["transformers"] = {"batch1_decode_tok_s": (args.decode_len - 1) / (t_full - t_one)}
    print(f"transformers batch 1: {report['transformers']['batch1_decode_tok_s']:.1f} tok/s", flush=True)
    for batch in args.batches:
        wall = generate(batch, args.output_len)
        report["transformers"][f"output_tok_s_{batch}"] = batch * args.output_len / wall
        print(f"transformers {batch} concurrent: {batch * args.output_len / wall:.1f} output tok/s", flush=True)
    model.to("meta")  # free the weights before the caller goes on
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def write_report(report: dict, out: Path) -> None:
    stem = result_stem(out, "engine_gpu", report["device_name"])  # never overwrites an earlier run
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    b1, hf = report["batch1"], report.get("transformers", {})
    lines = [f"# Engine on {report['device_name']} ({report['date']}, commit {report['commit']})", "",
             f"Model: {report['model']['model']} dummy weights, {report['model']['dtype']}, KV "
             f"{report['model']['kv_cache_dtype']}; measured through `lightspeed.LLM` (the engine core process).",
             ""]
    eager_b1, eager_tp = report.get("batch1_eager"), report.get("throughput_eager", {})
    main_name = "lightspeed, eager" if report["args"]["enforce_eager"] else "lightspeed, CUDA graphs"
    lines += [
              "| measure | lightspeed | lightspeed --enforce-eager | transformers |", "|---|---|---|---|",
              f"| decode tok/s, batch 1 ({b1['prompt_len']}-token prompt) | {b1['decode_tok_s']:.1f} | "
              f"{eager_b1['decode_tok_s'] if eager_b1 else float('nan'):.1f} | "
              f"{hf.get('batch1_decode_tok_s', float('nan')):.1f} |"]
    for batch, t in report["throughput"].items():
        eager_t = eager_tp.get(batch, {}).get("output_tok_s", float("nan"))
        lines.append(f"| output tok/s, {batch} concurrent ({report['args']['input_len']} in / "
                     f"{report['args']['output_len']} out) | {t['output_tok_s']:.1f} | {eager_t:.1f} | "
                     f"{hf.get(f'output_tok_s_{batch}', float('nan')):.1f} |")
    lines += ["", f"Batch-1 step {b1['median_step_ms']:.2f} ms vs speed of light {b1['speed_of_light_step_ms']:.2f} ms "
              f"({b1['bytes_per_step'] / 1e9:.2f} GB per step / 4.27 TB/s): **{b1['fraction_of_speed_of_light']:.1%} "
              f"of speed of light** ({main_name}; step time includes the scheduler, input upload and sampling)."]
    if eager_b1:
        lines.append(f"Eager: step {eager_b1['median_step_ms']:.2f} ms, "
                     f"{eager_b1['fraction_of_speed_of_light']:.1%} of speed of light.")
    lines.append("")
    stem.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {stem}.json and {stem}.md")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="dummy preset name or config.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", default="32,128", help="concurrent request counts")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--decode-len", type=int, default=128, help="tokens generated for the batch-1 measurement")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (not needed: prompts are token ids)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--kv-cache-memory", default="24GiB")
    p.add_argument("--host-cache-memory", default="1GiB")
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--enforce-eager", action="store_true", help="measure the engine without CUDA graphs only")
    p.add_argument("--no-eager-compare", action="store_true",
                   help="skip the second, --enforce-eager measurement of the engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results", help="folder for engine_gpu_<date-time>_<device>.json/.md")
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "args": vars(args),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__, "commit": git_commit()}
    t0 = time.perf_counter()
    run_engine(args, np.random.default_rng(args.seed), report, enforce_eager=args.enforce_eager)
    if not args.enforce_eager and not args.no_eager_compare:
        run_engine(args, np.random.default_rng(args.seed), report, enforce_eager=True, suffix="_eager")
    if not args.no_hf:
        run_transformers(args, np.random.default_rng(args.seed + 1), report)
    report["total_s"] = time.perf_counter() - t0
    write_report(report, Path(args.out))


if __name__ == "__main__":
    main()
