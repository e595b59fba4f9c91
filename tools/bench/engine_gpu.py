#!/usr/bin/env python
"""GPU first light: a Llama-3.1-8B-shaped dummy model in bf16 through Lightspeed's ModelRunner +
Scheduler (in-process: no ZMQ/msgspec needed), beside Hugging Face transformers on the same shapes.

Reports, in one run:
  1. greedy tokens with the registry's kernels (Triton on GPU) == with every op forced to its torch
     reference (lightspeed_kernel.override), on a short prompt;
  2. decode tok/s at batch 1 and its fraction of the speed of light:
     SOL step = (weight bytes read + KV bytes read per step) / 4.27 TB/s (H200 HBM);
  3. output tok/s with 32 and 128 concurrent requests (1024 prompt tokens, 128 output tokens);
  2-3 run twice: with CUDA graphs for decode steps (the default engine) and with --enforce-eager
     (no graphs), unless --enforce-eager (eager only) or --no-eager-compare (graphs only) is given;
  4. transformers `generate` (random-init LlamaForCausalLM from the same config, bf16, cuda) on
     the same shapes.

    python tools/bench/engine_gpu.py --out bench/results            # on the H200, < 5 minutes
    python tools/bench/engine_gpu.py --model tiny-llama --device cpu --batches 2,4 \
        --input-len 32 --output-len 8 --decode-len 8 --out /tmp/x  # smoke run on a CPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

HBM_BYTES_PER_S = 4.27e12


def sampling_spec(max_tokens: int) -> SimpleNamespace:
    """Greedy, ignore EOS: the fields the runner reads from a request's sampling spec."""
    return SimpleNamespace(max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                           min_tokens=0, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
                           logit_bias=None, logprobs=None, stop_token_ids=[], eos_token_ids=[], ignore_eos=True,
                           structured_kind=None, structured_spec=None)


class InProcessEngine:
    """Scheduler + ModelRunner in this process (what the engine core runs, minus the sockets)."""

    def __init__(self, args, enforce_eager: bool = False):
        from lightspeed.config import EngineConfig
        from lightspeed.runner.factory import build_model_runner
        from lightspeed_scheduler import Scheduler, SchedulerConfig

        self.config = EngineConfig(model=args.model, load_format="dummy", dtype=args.dtype, device=args.device,
                                   max_model_len=args.max_model_len, max_num_seqs=max(args.batches + [1]),
                                   max_num_batched_tokens=args.max_num_batched_tokens,
                                   chunked_prefill_size=args.max_num_batched_tokens,
                                   kv_cache_memory=args.kv_cache_memory, host_cache_memory=args.host_cache_memory,
                                   enable_prefix_cache=False, page_size=args.page_size,
                                   enforce_eager=enforce_eager)
        self.built = build_model_runner(self.config)
        self.runner, self.model_config = self.built.runner, self.built.model_config
        self.scheduler = Scheduler(SchedulerConfig(
            page_size=self.config.page_size, num_device_pages=self.built.num_device_pages,
            num_host_pages=self.built.num_host_pages, max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            chunked_prefill_size=self.config.chunked_prefill_size, max_model_len=self.built.max_model_len,
            policy="decode_first", enable_prefix_cache=False))
        self._next = 0

    def generate(self, prompts: list[list[int]], max_tokens: int, step_times: list | None = None) -> dict[int, list[int]]:
        """Greedy-generate for all prompts at once; returns req_id -> tokens. Optionally records
        (num_prefill_rows, seconds) for each step."""
        from lightspeed_scheduler import RequestSpec

        outputs: dict[int, list[int]] = {}
        for prompt in prompts:
            self._next += 1
            rid = self.scheduler.submit(RequestSpec(rid=f"r{self._next}", token_ids=prompt, max_new_tokens=max_tokens,
                                                    eos_token_ids=[], stop_token_ids=[], ignore_eos=True,
                                                    priority=0, num_draft_tokens=0))
            self.runner.add_request(rid, sampling_spec(max_tokens), prompt)
            outputs[rid] = []
        live = set(outputs)
        while live:
            t0 = time.perf_counter()
            plan = self.scheduler.next_plan()
            result = self.runner.execute(plan)
            finished = self.scheduler.advance(plan, result.tokens)
            if step_times is not None:
                step_times.append((int(plan.num_prefills), time.perf_counter() - t0))
            for rid, tok in zip(result.req_ids.tolist(), result.tokens.tolist(), strict=True):
                outputs[rid].append(tok)
            for rid, _ in finished:
                live.discard(rid)
                self.runner.remove_request(rid)
        return outputs

    def generate_reference(self, prompts: list[list[int]], max_tokens: int) -> dict[int, list[int]]:
        """`generate` with every op forced to its torch reference; eager, since the CUDA graphs
        replay the kernels they were captured with."""
        import lightspeed_kernel as lk

        graphs, self.runner.graphs = self.runner.graphs, None
        try:
            with lk.override(**reference_overrides()):
                return self.generate(prompts, max_tokens)
        finally:
            self.runner.graphs = graphs


def reference_overrides() -> dict[str, str]:
    """family/mode -> the torch reference kernel's name, for every registered op."""
    import lightspeed_kernel as lk

    return {f"{s.family}/{s.mode}": s.name for s in lk.REGISTRY.specs() if s.solution == "reference"}


def exact_check(args, rng: np.random.Generator) -> dict:
    """The same comparison in fp32 (TF32 off) on a smaller preset: random bf16 weights give near-tied
    logits, so a bf16 flip says little; in fp32 the two paths must agree token for token."""
    torch.backends.cuda.matmul.allow_tf32 = False
    small = argparse.Namespace(**{**vars(args), "model": args.exact_check_model, "dtype": "float32",
                                  "batches": [4], "kv_cache_memory": "2GiB"})
    engine = InProcessEngine(small)
    prompts = [rng.integers(0, engine.model_config.vocab_size, n).tolist() for n in (7, 33, 100, 300)]
    fast = list(engine.generate(prompts, args.check_len).values())
    ref = list(engine.generate_reference(prompts, args.check_len).values())
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    result = {"model": args.exact_check_model, "equal": fast == ref, "prompts": len(prompts),
              "tokens_each": args.check_len}
    print(f"fp32 greedy registry == reference on {args.exact_check_model}: {fast == ref}", flush=True)
    return result


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes_per_step(model: torch.nn.Module, tied: bool) -> int:
    """Bytes of weights a decode step reads: every parameter except the embedding table
    (one row per token) unless it doubles as the LM head."""
    total = 0
    for name, p in model.named_parameters():
        if "embed_tokens" in name and not tied:
            continue
        total += p.numel() * p.element_size()
    return total


def run_engine(args, rng: np.random.Generator, report: dict, *, enforce_eager: bool = False, suffix: str = "",
               checks: bool = True) -> None:
    """Measures 2-3 into report["batch1" + suffix] / ["throughput" + suffix]; 1 too with `checks`."""
    device = torch.device(args.device)
    engine = InProcessEngine(args, enforce_eager)
    graphs = engine.runner.graphs
    report["cuda_graphs" + suffix] = {"enabled": graphs is not None,
                                      "batch_sizes": graphs.batch_sizes if graphs is not None else []}
    print(f"[{'eager' if enforce_eager else 'graphs'}] CUDA graphs: "
          f"{graphs.batch_sizes if graphs is not None else 'off'}", flush=True)
    if device.type == "cuda" and not enforce_eager and graphs is None:
        print("WARNING: CUDA graphs were asked for but not captured (see the lightspeed.runner warning)", flush=True)
    mc = engine.model_config
    vocab = mc.vocab_size
    report["model"] = {"preset": args.model, "dtype": args.dtype, "layers": mc.num_hidden_layers,
                       "hidden": mc.hidden_size, "vocab": vocab, "num_device_pages": engine.built.num_device_pages}
    if checks:
        run_checks(args, rng, report, engine)
    measure(args, rng, report, engine, suffix)
    if graphs is not None:
        report["cuda_graphs" + suffix]["replays"] = graphs.num_replays
    del engine, graphs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_checks(args, rng: np.random.Generator, report: dict, engine: InProcessEngine) -> None:
    import lightspeed_kernel as lk

    device, vocab = torch.device(args.device), engine.model_config.vocab_size
    report["kernels"] = {}
    if device.type == "cuda":
        for family, mode in (("attention", "decode"), ("attention", "prefill"), ("norm", "rms"),
                             ("norm", "fused_add_rms"), ("rope", "rotary"), ("kv_store", "paged"), ("gemm", "bf16"),
                             ("activation", "silu_and_mul"), ("sampling", "sample")):
            try:
                chosen = lk.select_kernel(family, mode, getattr(torch, args.dtype), platform=lk.current_platform())
                report["kernels"][f"{family}/{mode}"] = chosen.name
            except Exception as e:  # a family without a kernel for this dtype: record why
                report["kernels"][f"{family}/{mode}"] = f"n/a ({type(e).__name__})"

    # 1. Registry kernels vs torch references, greedy, short prompt.
    prompt = rng.integers(0, vocab, args.check_prompt_len).tolist()
    fast = list(engine.generate([prompt], args.check_len).values())[0]
    ref = list(engine.generate_reference([prompt], args.check_len).values())[0]
    agree = next((i for i, (a, b) in enumerate(zip(fast, ref, strict=False)) if a != b), len(fast))
    report["greedy_vs_reference"] = {"equal": fast == ref, "tokens": len(fast), "first_divergence": agree,
                                     "fast": fast, "reference": ref}
    print(f"greedy registry == reference: {fast == ref} (agree on first {agree}/{len(fast)} tokens)", flush=True)

    if args.exact_check_model and device.type == "cuda":
        report["greedy_vs_reference_fp32"] = exact_check(args, rng)


def measure(args, rng: np.random.Generator, report: dict, engine: InProcessEngine, suffix: str) -> None:
    device, mc = torch.device(args.device), engine.model_config
    vocab, label = mc.vocab_size, "eager" if engine.config.enforce_eager else "graphs"
    # Warm-up (Triton JIT, allocator) on the shapes measured below.
    engine.generate([rng.integers(0, vocab, args.input_len).tolist()], 4)
    engine.generate([rng.integers(0, vocab, args.input_len).tolist() for _ in range(min(4, max(args.batches)))], 4)

    # 2. Batch-1 decode and speed of light.
    steps: list = []
    sync(device)
    engine.generate([rng.integers(0, vocab, args.input_len).tolist()], args.decode_len, steps)
    decode = [t for n_pre, t in steps if n_pre == 0]
    step_s = float(np.median(decode))
    kv_bytes_per_token = engine.built.runner.kv_cache.layout.bytes_per_page // args.page_size
    avg_ctx = args.input_len + args.decode_len / 2
    bytes_per_step = weight_bytes_per_step(engine.runner.model, mc.tie_word_embeddings) + avg_ctx * kv_bytes_per_token
    sol_s = bytes_per_step / HBM_BYTES_PER_S
    report["batch1" + suffix] = {
        "decode_tok_s": 1.0 / step_s, "median_step_ms": step_s * 1e3, "mean_step_ms": float(np.mean(decode)) * 1e3,
        "bytes_per_step": bytes_per_step, "speed_of_light_step_ms": sol_s * 1e3,
        "fraction_of_speed_of_light": sol_s / step_s, "prompt_len": args.input_len, "decode_steps": len(decode)}
    print(f"[{label}] batch 1: {1 / step_s:.1f} tok/s, step {step_s * 1e3:.2f} ms, SOL {sol_s * 1e3:.2f} ms "
          f"({sol_s / step_s:.1%})", flush=True)

    # 3. Concurrent requests.
    report["throughput" + suffix] = {}
    for batch in args.batches:
        prompts = [rng.integers(0, vocab, args.input_len).tolist() for _ in range(batch)]
        sync(device)
        t0 = time.perf_counter()
        outs = engine.generate(prompts, args.output_len)
        sync(device)
        wall = time.perf_counter() - t0
        produced = sum(len(v) for v in outs.values())
        report["throughput" + suffix][str(batch)] = {"output_tok_s": produced / wall, "wall_s": wall,
                                                     "output_tokens": produced}
        print(f"[{label}] {batch} concurrent: {produced / wall:.1f} output tok/s ({wall:.2f} s)", flush=True)


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
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"engine_gpu_{dt.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    b1, hf = report["batch1"], report.get("transformers", {})
    lines = [f"# Engine on {report['device_name']} ({report['date']})", "",
             f"Model: {report['model']['preset']} dummy weights, {report['model']['dtype']}; kernels: "
             + ", ".join(f"{k}={v}" for k, v in report.get("kernels", {}).items()), "",
             f"Greedy with registry kernels == torch references: **{report['greedy_vs_reference']['equal']}** "
             f"(first divergence at token {report['greedy_vs_reference']['first_divergence']} of "
             f"{report['greedy_vs_reference']['tokens']}; bf16 random weights have near-tied logits)", ""]
    if "greedy_vs_reference_fp32" in report:
        exact = report["greedy_vs_reference_fp32"]
        lines += [f"fp32 (TF32 off) on {exact['model']}, {exact['prompts']} prompts x {exact['tokens_each']} tokens: "
                  f"registry == reference: **{exact['equal']}**", ""]
    graphs = report["cuda_graphs"]
    eager_b1, eager_tp = report.get("batch1_eager"), report.get("throughput_eager", {})
    main_name = f"lightspeed, CUDA graphs {graphs['batch_sizes']}" if graphs["enabled"] else "lightspeed, eager"
    lines += [f"Engine: {main_name}" + (f"; {graphs['replays']} decode steps replayed" if graphs["enabled"] else ""), "",
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
    p.add_argument("--check-prompt-len", type=int, default=16)
    p.add_argument("--check-len", type=int, default=16, help="tokens compared against the reference path")
    p.add_argument("--exact-check-model", default="llama-3.2-1b",
                   help="preset for the fp32 registry-vs-reference greedy check on GPU ('' to skip)")
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
    p.add_argument("--out", default="bench/results", help="folder for engine_gpu_<date>.json/.md")
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",") if b]
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "args": vars(args),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
              "torch": torch.__version__}
    t0 = time.perf_counter()
    run_engine(args, np.random.default_rng(args.seed), report, enforce_eager=args.enforce_eager)
    if not args.enforce_eager and not args.no_eager_compare:
        run_engine(args, np.random.default_rng(args.seed), report, enforce_eager=True, suffix="_eager", checks=False)
    if not args.no_hf:
        run_transformers(args, np.random.default_rng(args.seed + 1), report)
    report["total_s"] = time.perf_counter() - t0
    write_report(report, Path(args.out))


if __name__ == "__main__":
    main()
