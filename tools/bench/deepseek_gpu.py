#!/usr/bin/env python
"""DeepSeek-V3 on one GPU: `deepseek-v3-6l` (DeepSeek-V3's first 6 layers at full width, 3 dense +
3 MoE) with dummy FP8 weights (e4m3, 128x128 block scales: the released checkpoint's format)
through the engine's step loop in-process (`lightspeed.core.engine.Engine`: scheduler, runner,
overlapped steps, CUDA graphs; no sockets), decode step time against the speed of light at
several batch sizes.

Reports, in one run (< 10 minutes on the H200, including Triton compilation and graph capture):
  1. the kernels the registry picks (mla/decode, mla/store, mla/prefill, gemm/fp8_block,
     moe/fused_experts_fp8, ...), and whether decode steps replay from CUDA graphs (the MLA
     plan/run decode captured inside them; with FlashInfer's MLA decode, mla_decode_flashinfer on
     sm_90 bf16 caches, the graphs it re-plans on the host before each replay: `host_planned`);
  2. greedy tokens with CUDA graphs == eager (same kernels; bf16 random weights have near ties, so
     a late divergence is reported, not failed);
  3. decode step time at batch 1, 16, 64 (steady state: every request past its prefill, the mean
     over `--decode-len` overlapped steps; context = the prompt + half the decode) and its fraction
     of the speed of light:
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

HBM_BYTES_PER_S = 4.27e12
KERNELS = [("mla", "decode", "bfloat16", {"page_size": 64, "kv_dtype": "bf16"}),
           ("mla", "store", "bfloat16", {}), ("mla", "prefill", "bfloat16", {"head_dim_qk": 192, "head_dim_v": 128}),
           ("gemm", "fp8_block", "float8_e4m3fn", {}), ("moe", "fused_experts_fp8", "bfloat16", {}),
           ("moe", "topk", "float32", {}), ("quantize", "fp8_per_block", "bfloat16", {}),
           ("norm", "fused_add_rms", "bfloat16", {}), ("rope", "rotary", "bfloat16", {})]
# MLA decode: ours (Triton split + combine) or FlashInfer's (FA3 BatchMLAPageAttentionHopperKernel, FA2
# BatchMLAPagedAttentionKernel).
PROFILE_GROUPS = {"mla_decode": ("_mla_attn_split_kernel", "_combine_kernel", "BatchMLAPage"),
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Bench:
    """The engine in this process, fed token-id prompts directly."""

    def __init__(self, args):
        from lightspeed.config import EngineConfig
        from lightspeed.core.engine import Engine

        self.args, self.device = args, torch.device(args.device)
        self.engine = Engine(EngineConfig(
            model=args.model, load_format="dummy", dtype=args.dtype, device=args.device,
            max_model_len=args.max_model_len, max_num_seqs=max(args.batches), page_size=args.page_size,
            max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
            host_cache_memory=0, enable_prefix_cache=False))
        self._next = 0

    def submit(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        from lightspeed.core import messages as m

        names = []
        for prompt in prompts:
            self._next += 1
            names.append(f"q{self._next}")
            spec = m.SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
            assert self.engine.add_request(m.AddRequest(names[-1], prompt, spec)) is None
        return names

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        names, tokens = self.submit(prompts, max_tokens), {}
        while self.engine.has_work():
            out = self.engine.step()
            for name, token in zip(out.request_ids, out.token_ids, strict=True):
                tokens.setdefault(name, []).append(token)
        return [tokens[n] for n in names]

    def decode_step(self, batch: int, input_len: int, steps: int) -> tuple[float, int]:
        """Mean seconds per decode step at `batch` running requests (all past their prefill)."""
        vocab = self.engine.vocab_size
        rng = np.random.default_rng(batch)
        names = set(self.submit([rng.integers(0, vocab, input_len).tolist() for _ in range(batch)], steps + 8))
        started: set[str] = set()
        while started != names:  # prefill chunks, then every request has its first tokens
            started |= set(self.engine.step().request_ids)
        for _ in range(2):
            self.engine.step()
        sync(self.device)
        t0, produced = time.perf_counter(), 0
        for _ in range(steps):
            produced += len(self.engine.step().request_ids)
        sync(self.device)
        elapsed = time.perf_counter() - t0
        self.engine.abort_requests(sorted(names))
        while self.engine.has_work():
            self.engine.step()
        assert produced >= batch * (steps - 1), (produced, batch, steps)
        return elapsed / steps, produced


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


def profile_shares(bench: Bench, batch: int, input_len: int) -> dict[str, float]:
    """GPU-time shares of kernel groups over eager decode steps (graph replays hide their kernels)."""
    from torch.profiler import ProfilerActivity, profile

    runner = bench.engine.runner
    graphs, runner.graphs = runner.graphs, None
    try:
        bench.decode_step(batch, input_len, 3)  # the eager path warm
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            bench.decode_step(batch, input_len, 6)
    finally:
        runner.graphs = graphs
    times: dict[str, float] = {}
    for event in prof.key_averages():
        device_time = float(getattr(event, "self_device_time_total", 0.0) or getattr(event, "self_cuda_time_total", 0.0))
        times[event.key] = times.get(event.key, 0.0) + device_time
    total = sum(times.values()) or 1.0
    shares = {group: sum(t for k, t in times.items() if any(n in k for n in names)) / total
              for group, names in PROFILE_GROUPS.items()}
    shares["other"] = 1.0 - sum(shares.values())
    return shares


def run(args) -> dict:
    rng = np.random.default_rng(0)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    bench = Bench(args)
    load_s = time.perf_counter() - t0
    engine = bench.engine
    mc, runner = engine.model_config, engine.runner
    graphs = runner.graphs
    report = {"model": {"preset": args.model, "layers": mc.num_hidden_layers, "hidden": mc.hidden_size,
                        "quantization": str(mc.quantization), "kv_layout": str(runner.kv_cache.layout),
                        "weight_gb": sum(p.numel() * p.element_size() for p in runner.model.parameters()) / 1e9},
              "load_and_capture_s": load_s, "kernels": kernel_choices(device),
              "cuda_graphs": {"enabled": graphs is not None, "batch_sizes": graphs.batch_sizes if graphs else [],
                              # graphs whose kernels plan on the host, re-planned before each replay
                              # (mla_decode_flashinfer); 0 with the Triton MLA decode
                              "host_planned": len(getattr(graphs, "_host_plans", {})) if graphs else 0}}
    print(json.dumps(report, indent=1), flush=True)
    vocab = mc.vocab_size
    for batch in args.batches:  # warm-up: Triton compiles prefill and every decode shape measured below
        bench.generate([rng.integers(0, vocab, 64).tolist() for _ in range(batch)], 3)
    # 2. graphs == eager, greedy.
    prompts = [rng.integers(0, vocab, args.input_len).tolist() for _ in range(2)]
    with_graphs = bench.generate(prompts, args.check_len)
    runner.graphs = None
    eager = bench.generate(prompts, args.check_len)
    runner.graphs = graphs
    first = next((i for a, b in zip(with_graphs, eager, strict=True)
                  for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    report["greedy_graphs_vs_eager"] = {"equal": with_graphs == eager, "first_divergence": first,
                                        "tokens": args.check_len}
    print(f"greedy with CUDA graphs == eager: {with_graphs == eager} (first divergence {first})", flush=True)
    # 3. decode step time vs speed of light.
    kv_per_token = runner.kv_cache.layout.bytes_per_page // args.page_size
    report["decode"] = {}
    for batch in args.batches:
        replays = graphs.num_replays if graphs else 0
        step, produced = bench.decode_step(batch, args.input_len, args.decode_len)
        ctx = args.input_len + args.decode_len // 2
        sol = step_bytes(runner.model, mc, batch, ctx, kv_per_token) / HBM_BYTES_PER_S
        report["decode"][str(batch)] = {
            "mean_step_ms": step * 1e3, "tok_s": batch / step, "speed_of_light_step_ms": sol * 1e3,
            "fraction_of_speed_of_light": sol / step, "steps": args.decode_len, "context": ctx,
            "graph_replays": (graphs.num_replays - replays) if graphs else 0}
        print(f"batch {batch}: step {step * 1e3:.2f} ms, {batch / step:.0f} tok/s, SOL {sol * 1e3:.2f} ms "
              f"({sol / step:.1%}), graph replays {report['decode'][str(batch)]['graph_replays']}", flush=True)
    if args.profile and device.type == "cuda":
        report["profile_batch16_eager"] = profile_shares(bench, 16, args.input_len)
        print("GPU time shares (eager, batch 16):", report["profile_batch16_eager"], flush=True)
    del bench, engine
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
             f"Greedy with CUDA graphs == eager: **{report['greedy_graphs_vs_eager']['equal']}** (first divergence "
             f"{report['greedy_graphs_vs_eager']['first_divergence']} of {report['greedy_graphs_vs_eager']['tokens']})",
             "",
             "| batch | step ms | tok/s | speed of light ms | fraction | graph replays |", "|---|---|---|---|---|---|"]
    for batch, d in report["decode"].items():
        lines.append(f"| {batch} | {d['mean_step_ms']:.2f} | {d['tok_s']:.0f} | {d['speed_of_light_step_ms']:.2f} | "
                     f"{d['fraction_of_speed_of_light']:.1%} | {d['graph_replays']} |")
    if "profile_batch16_eager" in report:
        lines += ["", "GPU time shares, eager batch-16 decode: " + ", ".join(
            f"{k} {v:.1%}" for k, v in report["profile_batch16_eager"].items())]
    lines += ["", "Step time: the engine's overlapped loop in steady state (scheduler, input upload, sampling "
              "included); SOL counts the routed experts a batch touches under uniform routing "
              "(tools/bench/deepseek_gpu.py)."]
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
