#!/usr/bin/env python
"""CPU GEMM candidates on SmolLM2-135M's shapes: fp32 torch.nn.functional.linear, PyTorch's weight-only
CPU kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`, with fp32 and bf16 activations)
and Lightspeed's native w4 / w8 kernels (fused with fp32 activations, the same with its panel path
off ("row tiles": the kernel before that path), fused with int8 activations (q8_gemm.c, also at
1 row here), and dequantise + torch GEMM), per token count.

Times are the best of --trials of CPU time of this process (less sensitive than wall time to other
processes on a shared machine) with the 1-minute load average beside them. Weights are cycled
through --copies distinct matrices so that, as in a decode step, they do not sit in cache.

    python tools/bench/kernels_cpu.py --out bench/results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time

import torch
import torch.nn.functional as F
from result_files import git_commit, result_stem

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def cpu_time(fn, trials: int, inner: int) -> float:
    best = float("inf")
    for _ in range(trials):
        start = time.process_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.process_time() - start) / inner)
    return best


def candidates(n: int, k: int, tokens: int, copies: int):
    """name -> zero-argument callable doing one [tokens, k] x [k, n] product on a cold weight copy."""
    from lightspeed_kernel import QuantizedWeight
    from lightspeed_kernel.cpu import gemm

    dense = [torch.randn(n, k) * 0.02 for _ in range(copies)]
    x = torch.randn(tokens, k)
    xb = x.bfloat16()
    w4 = [QuantizedWeight.quantize(w, 4, 32) for w in dense]
    w8 = [QuantizedWeight.quantize(w, 8, 32) for w in dense]
    i8 = [(w / (w.abs().amax(1, keepdim=True) / 127)).round().to(torch.int8) for w in dense]
    i8_scale = [w.abs().amax(1) / 127 for w in dense]
    codes = [torch.randint(0, 16, (n, k), dtype=torch.int32) for _ in range(copies)]
    i4 = [torch.ops.aten._convert_weight_to_int4pack_for_cpu(c, 1) for c in codes]
    i4_sz = torch.randn(k // 32, n, 2)
    turn = [0]

    def cycle(table):
        turn[0] = (turn[0] + 1) % copies
        return table[turn[0]]

    def native(weight, dense_path, panels=True):
        rows, panel_rows = gemm.DENSE_MIN_ROWS, gemm.PANEL_MIN_ROWS
        gemm.DENSE_MIN_ROWS = 1 if dense_path else 1 << 30
        if not panels:  # the row-tile kernel at every row count (what ran before the panel path)
            gemm.PANEL_MIN_ROWS = 1 << 30
        try:
            return gemm._linear(weight.bits, x, weight.qweight, weight.scales, weight.mins, None, weight.group_size)
        finally:
            gemm.DENSE_MIN_ROWS, gemm.PANEL_MIN_ROWS = rows, panel_rows

    def native_int8_x(weight):  # the int8-activation kernel itself, whatever the env switch says
        out = torch.empty(tokens, n)
        gemm.linear_q8_into(weight.bits, x, weight.qweight, weight.scales, weight.mins, None, weight.group_size, out)
        return out

    return {
        "fp32 F.linear": lambda: F.linear(x, cycle(dense)),
        "torch int8pack (fp32 x)": lambda: torch.ops.aten._weight_int8pack_mm(x, cycle(i8), i8_scale[turn[0]]),
        "torch int8pack (bf16 x)": lambda: torch.ops.aten._weight_int8pack_mm(xb, cycle(i8),
                                                                               i8_scale[turn[0]].bfloat16()),
        "torch int4pack (fp32 x)": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, cycle(i4), 32, i4_sz),
        "torch int4pack (bf16 x)": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, cycle(i4), 32,
                                                                                      i4_sz.bfloat16()),
        "native w8 fused": lambda: native(cycle(w8), False),
        "native w8 fused row tiles": lambda: native(cycle(w8), False, panels=False),
        "native w8 fused int8 x": lambda: native_int8_x(cycle(w8)),
        "native w4 fused": lambda: native(cycle(w4), False),
        "native w4 fused row tiles": lambda: native(cycle(w4), False, panels=False),
        "native w4 fused int8 x": lambda: native_int8_x(cycle(w4)),
        "native w4 dequant+GEMM": lambda: native(cycle(w4), True),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tokens", default="1,4,16,24,64")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--kernels", default="", help="comma-separated candidate names to run (default: all)")
    p.add_argument("--copies", type=int, default=8)
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for shape, (n, k) in SHAPES.items():
            if shape == "lm_head" and tokens > 16:
                continue
            inner = max(1, int(2e7 // (n * k * max(tokens, 4))))
            wanted = set(filter(None, args.kernels.split(",")))
            for name, fn in candidates(n, k, tokens, args.copies).items():
                if wanted and name not in wanted:
                    continue
                for _ in range(args.copies):  # every copy once: per-weight state (int8 scales) made untimed
                    fn()
                seconds = cpu_time(fn, args.trials, inner)
                results.append({"shape": shape, "n": n, "k": k, "tokens": tokens, "kernel": name,
                                "us": seconds * 1e6, "gflops": 2 * n * k * tokens / seconds / 1e9,
                                "load1": round(os.getloadavg()[0], 2)})
                print(f"T={tokens:<3} {shape:<8} {name:<26} {seconds * 1e6:9.1f} us  load {results[-1]['load1']}",
                      flush=True)
    now = dt.datetime.now(dt.timezone.utc)
    commit = git_commit()
    report = {"date": now.isoformat(timespec="seconds"), "commit": commit, "threads": args.threads,
              "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "cores": os.cpu_count(), "results": results}
    stem = result_stem(args.out, f"kernels_cpu_t{args.threads}")
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2))
    kernels = list(dict.fromkeys(r["kernel"] for r in results))
    lines = [f"# CPU GEMM kernels on SmolLM2-135M shapes ({report['date']}, commit {commit})", "",
             f"{os.cpu_count()} cores, {args.threads} thread(s), torch {torch.__version__} "
             f"({report['cpu_capability']}); best of {args.trials} trials of process CPU time, cold weights "
             f"({args.copies} copies cycled); microseconds per call. Load average (1 min) per row.", "",
             "| T | shape | " + " | ".join(kernels) + " | load |", "|---|---|" + "---|" * (len(kernels) + 1)]
    for key in dict.fromkeys((r["tokens"], r["shape"]) for r in results):
        row = [r for r in results if (r["tokens"], r["shape"]) == key]
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{r['us']:.0f}" for r in row)
                     + f" | {max(r['load1'] for r in row)} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
