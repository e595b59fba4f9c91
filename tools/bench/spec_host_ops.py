#!/usr/bin/env python
"""Host-side torch ops per engine step outside the model forward, per speculative method.

Why: for a small model the H200 finishes a step's kernels before the host has launched the next
(bench/results/spec_h200_smol_2026-12-01_2228), so every op the speculative path adds around the
forward (input fix-ups, verification, draft search, bookkeeping) is step time. This counts them on
any machine: the real Engine on a tiny random Llama (eager, so CPU and GPU count alike), every aten
op dispatched during `Engine.step` except the model forward and views (no kernel behind them), divided
by the steps taken. A call of a spec kernel op (SPEC_KERNELS: the draft search, ...) counts as one
launch (its Triton kernel on GPU), not as the ops of the torch reference that runs on CPU.
Host-to-device uploads (`runner.inputs.upload`: a pinned copy and a launch on GPU, a no-op view on
CPU) are counted apart.

    python tools/bench/spec_host_ops.py --out bench/results        # ~1 minute on CPU
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import torch
from result_files import git_commit, result_stem
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

# aten ops that only make views: no kernel launch behind them
VIEW_OPS = ("slice", "select", "view", "unsqueeze", "squeeze", "detach", "lift_fresh", "resolve_", "alias",
            "expand", "as_strided", "aten.t.", "permute", "split", "unbind")
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1024, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32"}
# lightspeed_kernel.ops of the speculative path (Triton launches on GPU)
SPEC_KERNELS = ("ngram_lookup", "ngram_record", "spec_verify", "spec_shift_rows", "spec_fill_drafts")
METHODS = (("none", True), ("ngram", False), ("ngram_gpu", True), ("suffix", False))


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if not any(v in name for v in VIEW_OPS):
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


def uncounted(fn):
    def call(*args, **kwargs):
        with _disable_current_modes():
            return fn(*args, **kwargs)
    return call


class count_uploads:
    """Counts calls of runner.inputs.upload in every lightspeed module that imported it."""

    def __init__(self):
        import sys

        from lightspeed.runner import inputs

        self.original, self.calls, self.patched = inputs.upload, 0, []
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("lightspeed.") and \
                    getattr(module, "upload", None) is self.original:
                module.upload = self._upload
                self.patched.append(module)

    def _upload(self, *args, **kwargs):
        self.calls += 1
        return self.original(*args, **kwargs)

    def restore(self) -> None:
        for module in self.patched:
            module.upload = self.original


class count_spec_kernels:
    """Each call of a `lightspeed_kernel.ops` spec op from lightspeed.spec counts as one launch (its
    Triton kernel on GPU), not as the aten ops of the torch reference that runs on CPU."""

    def __init__(self, counter: OpCounter):
        import sys

        import lightspeed_kernel

        self.original, self.patched = lightspeed_kernel.ops, []

        def launch(name, fn):
            def call(*args, **kwargs):
                counter.counts[f"launch {name}"] += 1
                return uncounted(fn)(*args, **kwargs)
            return staticmethod(call)

        proxy = type("Ops", (), {name: launch(name, getattr(self.original, name)) for name in SPEC_KERNELS
                                 if hasattr(self.original, name)})
        for module in list(sys.modules.values()):
            if getattr(module, "__name__", "").startswith("lightspeed.spec") and \
                    getattr(module, "ops", None) is self.original:
                module.ops = proxy
                self.patched.append(module)

    def restore(self) -> None:
        for module in self.patched:
            module.ops = self.original


def count(model_dir: str, method: str, overlap: bool, *, rows: int, tokens: int, top: int = 12) -> dict:
    from lightspeed.config import EngineConfig
    from lightspeed.core import messages as m
    from lightspeed.core.engine import Engine

    spec = None if method == "none" else {"method": method, "num_speculative_tokens": 4, "prompt_lookup_min": 1}
    engine = Engine(EngineConfig(model=model_dir, load_format="dummy", kv_cache_memory="64MiB", max_num_seqs=rows,
                                 max_model_len=512, enforce_eager=True, async_scheduling=overlap,
                                 speculative_config=spec))
    sampling = m.SamplingSpec(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    def submit_all(tag: str) -> None:
        for i in range(rows):  # repeating prompts: the drafters find matches
            assert engine.add_request(m.AddRequest(f"{tag}{i}", [5 + i % 3, 6, 7, 8] * 20, sampling)) is None

    def drain() -> int:
        steps = 0
        while engine.has_work() or engine.has_pending_copies():
            engine.step()
            steps += 1
        return steps

    submit_all("warm")
    drain()
    engine.runner.forward_eager = uncounted(engine.runner.forward_eager)
    counter = OpCounter()
    launches = count_spec_kernels(counter)
    uploads = count_uploads()
    submit_all("run")
    try:
        with counter:
            steps = drain()
    finally:
        launches.restore()
        uploads.restore()
    total = sum(counter.counts.values())
    return {"method": method, "overlap": overlap, "steps": steps, "output_tokens": rows * tokens,
            "ops_per_step": round(total / steps, 1), "uploads_per_step": round(uploads.calls / steps, 1),
            "top_ops": [(name, round(n / steps, 2)) for name, n in counter.counts.most_common(top)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=16, help="concurrent requests")
    ap.add_argument("--tokens", type=int, default=60, help="output tokens per request")
    ap.add_argument("--top", type=int, default=0, help="also list each method's N most frequent ops (per step)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(TINY))
        runs = [count(folder, method, overlap, rows=args.rows, tokens=args.tokens, top=max(args.top, 12)) for method, overlap in METHODS]
    result = {"commit": git_commit(), "rows": args.rows, "tokens": args.tokens, "runs": runs}
    stem = result_stem(args.out, "spec_host_ops")
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [f"# Host ops per engine step outside the forward (commit {result['commit']}, {args.rows} requests "
             f"x {args.tokens} tokens, tiny Llama, eager)", "",
             "| method | overlapped | steps | ops per step | uploads per step | ops + 2 x uploads per output token |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        per_token = (r["ops_per_step"] + 2 * r["uploads_per_step"]) * r["steps"] / r["output_tokens"]
        lines.append(f"| {r['method']} | {r['overlap']} | {r['steps']} | {r['ops_per_step']} | "
                     f"{r['uploads_per_step']} | {per_token:.2f} |")
    for r in runs if args.top else ():
        lines += ["", f"## Top ops per step: {r['method']} (overlapped {r['overlap']})", "", "| op | per step |", "|---|---|"]
        lines += [f"| `{name}` | {n} |" for name, n in r["top_ops"][: args.top]]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
