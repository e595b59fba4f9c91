#!/usr/bin/env python
"""DeepSeek-V3 on one GPU: `deepseek-v3-6l` (DeepSeek-V3's first 6 layers at full width, 3 dense +
3 MoE) with dummy FP8 weights (e4m3, 128x128 block scales: the released checkpoint's format)
through Lightspeed's ModelRunner + Scheduler in-process, decode step time against the speed of
light at several batch sizes.

Reports, in one run (< 10 minutes on the H200, including Triton compilation and graph capture):
  1. the kernels the registry picks (mla/decode, mla/store, mla/prefill, gemm/fp8_block,
     moe/fused_experts_fp8, ...), and whether decode steps replay from CUDA graphs (the MLA
     plan/run decode captured inside them);
  2. greedy tokens with CUDA graphs == eager (same kernels);
  3. decode step time at batch 1, 16, 64 (median over decode-only steps, context = the prompt +
     the tokens so far) and its fraction of the speed of light:
     SOL = (weight bytes a step reads + latent KV bytes) / 4.27 TB/s, where the weight bytes are
     the dense layers, the attention, the shared experts, the LM head, and the routed experts a
     batch of B tokens touches, E·(1 - (1 - k/E)^B) per MoE layer for uniform routing (random
     weights route near-uniformly);
  4. an eager torch.profiler trace of a few batch-16 decode steps: the share of GPU time in the MLA
     decode kernel, FP8 GEMMs and the FP8 MoE (kernel-name matches).

    python tools/bench/deepseek_gpu.py --out bench/results          # H200
    python tools/bench/deepseek_gpu.py --model tiny-deepseek-v3 --device cpu --batches 1,2 \\
        --input-len 32 --decode-len 4 --no-profile --out /tmp/x      # CPU smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from engine_gpu import HBM_BYTES_PER_S, InProcessEngine, sync

KERNELS = [("mla", "decode", "bfloat16", {"page_size": 64, "kv_dtype": "bf16"}),
           ("mla", "store", "bfloat16", {}), ("mla", "prefill", "bfloat16", {"head_dim_qk": 192, "head_dim_v": 128}),
           ("gemm", "fp8_block", "float8_e4m3fn", {}), ("moe", "fused_experts_fp8", "bfloat16", {}),
           ("moe", "topk", "float32", {}), ("quantize", "fp8_per_block", "bfloat16", {}),
           ("norm", "fused_add_rms", "bfloat16", {}), ("rope", "rotary", "bfloat16", {})]
PROFILE_GROUPS = {"mla_decode": ("_mla_attn_split_kernel", "_combine_kernel"),
                  "fp8_gemm": ("_fp8_block_gemm_kernel",),
                  "fp8_moe": ("_fp8_moe_gemm1_kernel", "_fp8_moe_gemm2_kernel"),
                  "fp8_quant": ("_quant_group_kernel",)}


def step_bytes(model: torch.nn.Module, config, batch: int, ctx: int, kv_bytes_per_token: int) -> int:
    """Bytes one decode step of `batch` tokens reads: weights touched + latent KV of every row."""
    total = 0
    experts = config.num_experts
    touched = experts * (1 - (1 - config.num_experts_per_tok / max(experts, 1)) ** batch) if experts else 0
    for name, p in model.named_parameters():
        if "embed_tokens" in name:
            continue  # one row per token
        size = p.numel() * p.element_size()
        if ".mlp.experts." in name:
            size = size * touched / experts
        total += size
    return int(total + batch * ctx * kv_bytes_per_token)


def decode_steps(engine: InProcessEngine, rng, batch: int, input_len: int, decode_len: int) -> list[float]:
    vocab = engine.model_config.vocab_size
    steps: list = []
    sync(torch.device(engine.config.device))
    engine.generate([rng.integers(0, vocab, input_len).tolist() for _ in range(batch)], decode_len, steps)
    return [t for n_prefill, t in steps if n_prefill == 0]


def kernel_choices(device: torch.device) -> dict[str, str]:
    import lightspeed_kernel as lk

    platform_ = lk.platform_of(device)
    out = {}
    for family, mode, dtype, traits in KERNELS:
        try:
            out[f"{family}/{mode}"] = lk.select_kernel(family, mode, getattr(torch, dtype), platform=platform_,
                                                       traits=traits).name
        except Exception as e:  # noqa: BLE001 - a missing kernel is a finding, not a crash
            out[f"{family}/{mode}"] = f"n/a ({type(e).__name__})"
    return out


def profile_shares(engine: InProcessEngine, rng, batch: int, input_len: int) -> dict[str, float]:
    """GPU-time shares of kernel groups over a few eager decode steps (graphs hidden from the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    graphs, engine.runner.graphs = engine.runner.graphs, None
    try:
        decode_steps(engine, rng, batch, input_len, 3)  # warm the eager path
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            decode_steps(engine, rng, batch, input_len, 6)
    finally:
        engine.runner.graphs = graphs
    times: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type.name == "CUDA" or getattr(event, "self_device_time_total", 0):
            times[event.key] = times.get(event.key, 0.0) + float(getattr(event, "self_device_time_total", 0.0))
    total = sum(times.values()) or 1.0
    shares = {group: sum(t for k, t in times.items() if any(n in k for n in names)) / total
              for group, names in PROFILE_GROUPS.items()}
    shares["other"] = 1.0 - sum(shares.values())
    return shares


def run(args) -> dict:
    rng = np.random.default_rng(0)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    engine = InProcessEngine(args)
    load_s = time.perf_counter() - t0
    mc, runner = engine.model_config, engine.runner
    graphs = runner.graphs
    report = {"model": {"preset": args.model, "layers": mc.num_hidden_layers, "hidden": mc.hidden_size,
                        "quantization": str(mc.quantization), "kv_layout": str(runner.kv_cache.layout),
                        "weight_gb": sum(p.numel() * p.element_size() for p in runner.model.parameters()) / 1e9},
              "load_and_capture_s": load_s, "kernels": kernel_choices(device),
              "cuda_graphs": {"enabled": graphs is not None, "batch_sizes": graphs.batch_sizes if graphs else []}}
    print(json.dumps(report, indent=1), flush=True)
    vocab = mc.vocab_size
    # Warm-up: Triton compiles for prefill and every decode batch shape measured below.
    for batch in args.batches:
        engine.generate([rng.integers(0, vocab, 64).tolist() for _ in range(batch)], 3)
    # 2. graphs == eager, greedy (same kernels, so bit-stable up to split-KV order: all equal expected).
    prompt = [rng.integers(0, vocab, args.input_len).tolist() for _ in range(2)]
    with_graphs = list(engine.generate(prompt, args.check_len).values())
    engine.runner.graphs = None
    eager = list(engine.generate(prompt, args.check_len).values())
    engine.runner.graphs = graphs
    report["greedy_graphs_equal_eager"] = with_graphs == eager
    print(f"greedy with CUDA graphs == eager: {with_graphs == eager}", flush=True)
    # 3. decode step time vs speed of light.
    kv_per_token = runner.kv_cache.layout.bytes_per_page // args.page_size
    report["decode"] = {}
    for batch in args.batches:
        replays = graphs.num_replays if graphs else 0
        times = decode_steps(engine, rng, batch, args.input_len, args.decode_len)
        step = float(np.median(times))
        ctx = args.input_len + args.decode_len // 2
        sol = step_bytes(runner.model, mc, batch, ctx, kv_per_token) / HBM_BYTES_PER_S
        report["decode"][str(batch)] = {
            "median_step_ms": step * 1e3, "tok_s": batch / step, "speed_of_light_step_ms": sol * 1e3,
            "fraction_of_speed_of_light": sol / step, "steps": len(times), "context": ctx,
            "graph_replays": (graphs.num_replays - replays) if graphs else 0}
        print(f"batch {batch}: step {step * 1e3:.2f} ms, {batch / step:.0f} tok/s, SOL {sol * 1e3:.2f} ms "
              f"({sol / step:.1%}), graph replays {report['decode'][str(batch)]['graph_replays']}", flush=True)
    if args.profile and device.type == "cuda":
        report["profile_batch16_eager"] = profile_shares(engine, rng, 16, args.input_len)
        print("GPU time shares (eager, batch 16):", report["profile_batch16_eager"], flush=True)
    del engine
    gc.collect()
    return report


def write(report: dict, args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y-%m-%d_%H%M")
    device = report["device_name"].replace(" ", "_").lower()
    stem = out / f"deepseek_gpu_{stamp}_{device}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    lines = [f"# {report['model']['preset']} on {report['device_name']} ({report['date']}, commit {report['commit']})",
             "", f"Weights {report['model']['weight_gb']:.1f} GB ({report['model']['quantization']}); KV "
             f"{report['model']['kv_layout']}; CUDA graphs {report['cuda_graphs']}", "",
             "Kernels: " + ", ".join(f"{k}={v}" for k, v in report["kernels"].items()), "",
             f"Greedy with CUDA graphs == eager: **{report['greedy_graphs_equal_eager']}**", "",
             "| batch | step ms | tok/s | speed of light ms | fraction | graph replays |", "|---|---|---|---|---|---|"]
    for batch, d in report["decode"].items():
        lines.append(f"| {batch} | {d['median_step_ms']:.2f} | {d['tok_s']:.0f} | {d['speed_of_light_step_ms']:.2f} | "
                     f"{d['fraction_of_speed_of_light']:.1%} | {d['graph_replays']} |")
    if "profile_batch16_eager" in report:
        lines += ["", "GPU time shares, eager batch-16 decode: " + ", ".join(
            f"{k} {v:.1%}" for k, v in report["profile_batch16_eager"].items())]
    lines += ["", "Step time includes the scheduler, input upload and sampling; SOL counts the routed experts a "
              "batch touches under uniform routing (see tools/bench/deepseek_gpu.py)."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {stem}.json and {stem}.md")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="deepseek-v3-6l", help="dummy preset name or config.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batches", default="1,16,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--decode-len", type=int, default=32)
    p.add_argument("--check-len", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--kv-cache-memory", default="16GiB")
    p.add_argument("--host-cache-memory", default="256MiB")
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    report = run(args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report.update(date=dt.datetime.now().isoformat(timespec="seconds"), commit=commit or "unknown",
                  device_name=torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
                  torch=torch.__version__, args=vars(args))
    write(report, args)


if __name__ == "__main__":
    main()
