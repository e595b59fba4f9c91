#!/usr/bin/env python
"""Paged decode attention at the served sweep's shapes: ours beside FlashInfer's and vLLM's FlashAttention-3.

The served side by side (bench/results/h100_vs_vllm_2026-12-07_1430/) has Lightspeed's TPOT 5% above vLLM's at
agentic c = 16 (16 requests at ~23K tokens: attention reads ~3.5x the weights' bytes) and 2% above at random
c = 32, while batch 1 is faster. This times the kernel that dominates those steps, Llama-3-8B heads (32 q / 8 kv,
head dim 128, bf16, page 16, one query token), three ways on the same data:
- ours: `lightspeed_kernel.triton.attention_decode`, planned once, replayed from a CUDA graph (as in the engine);
- FlashInfer's paged decode (when `tools/bench/h200/flashinfer_setup.sh` put it on the path), its planned kernel
  in a graph;
- vLLM's FlashAttention-3 (`vllm.vllm_flash_attn.flash_attn_varlen_func`, fa_version 3, with the scheduler
  metadata vLLM computes once a step), when vLLM is importable: after `tools/bench/h200/vllm.sh` has installed
  it on the device, `PYTHONPATH=/tmp/vsite:$PYTHONPATH`. It is timed, never vendored.
Each: median of graph replays (triton.testing.do_bench, L2 flushed), KV bytes read / time against --peak-tbs,
and the relative error against ours.

    python tools/bench/decode_vs_peers.py --out OUT                      # on the GPU
    python tools/bench/decode_vs_peers.py --out OUT --shapes 16:23552,32:1088 --peak-tbs 3.35
    python tools/bench/decode_vs_peers.py --out /tmp/x --smoke            # CPU interpreter, tiny shapes
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys

import torch
from kernels import _decode_setup, _flashinfer_decode, bench_graph_ms, rel_err
from result_files import device_name, git_commit, result_stem

HQ, HKV, D, PAGE = 32, 8, 128, 16
# (batch, context): agentic c = 1 / 4 / 16 at ~23K tokens, random 1024/128 at c = 32 and the 64 rows of c = 128
SERVED_SHAPES = [(1, 23552), (4, 23552), (16, 23552), (32, 1088), (64, 1088)]
SMOKE_SHAPES = [(2, 64), (1, 128)]


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """'16:23552,32:1088' -> [(16, 23552), (32, 1088)] (batch:context; context rounded down to whole pages)."""
    shapes = []
    for item in text.split(","):
        batch, ctx = (int(v) for v in item.split(":"))
        if batch < 1 or ctx < PAGE:
            raise ValueError(f"shape {item!r}: batch >= 1 and context >= {PAGE} tokens")
        shapes.append((batch, ctx // PAGE * PAGE))
    return shapes


def vllm_fa3():
    """vLLM's FA3 varlen entry points, or None with the reason when vLLM (or its FA3 build) is not importable."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata
    except Exception as e:  # not installed here, or built without FA3
        return None, f"{type(e).__name__}: {str(e)[:160]}"
    return (flash_attn_varlen_func, get_scheduler_metadata), None


def time_vllm_fa3(fa3, args, ctx: int, scale: float, ours: torch.Tensor, ms: float) -> dict:
    """vLLM's FA3 decode on our cache (its layout: [pages, page, kv heads, head dim]) as its FlashAttention
    backend calls it for a decode batch: scheduler metadata once, then the varlen call with the block table."""
    varlen, metadata = fa3
    q, k_cache, v_cache, page_table, qsl, seq_lens = args
    batch = q.shape[0]
    out = torch.empty_like(q)
    try:
        sched = metadata(batch, 1, ctx, HQ, HKV, D, seq_lens, qkv_dtype=q.dtype, cu_seqlens_q=qsl, page_size=PAGE,
                         causal=True)

        def run():
            return varlen(q, k_cache, v_cache, max_seqlen_q=1, cu_seqlens_q=qsl, max_seqlen_k=ctx,
                          seqused_k=seq_lens, softmax_scale=scale, causal=True, block_table=page_table, out=out,
                          scheduler_metadata=sched, fa_version=3)

        fa_ms = bench_graph_ms(run, quick=False)
        return {"vllm_fa3_ms": fa_ms, "ours_over_vllm_fa3": ms / fa_ms, "rel_err_vs_vllm_fa3": rel_err(out, ours)}
    except Exception as e:  # a call it does not take is part of the record
        return {"vllm_fa3_error": f"{type(e).__name__}: {str(e)[:200]}"}


def measure(shapes, dev, peak_tbs: float, flashinfer=None, fa3=None) -> list[dict]:
    from lightspeed_kernel.triton import attention_decode as dec

    rows = []
    for batch, ctx in shapes:
        args = _decode_setup(batch, ctx, PAGE, HQ, HKV, D, dev)
        q, kc, vc, pt, qsl, sl = args
        plan = dec.plan_decode(batch, HQ, HKV, D, PAGE, pt.shape[1], 1)
        ws = torch.empty(dec.decode_workspace_numel(plan, batch, HQ, D), device=dev)
        out = torch.empty_like(q)
        scale = 1.0 / math.sqrt(D)
        run = functools.partial(dec.run_decode, plan, q, kc, vc, pt, qsl, sl, scale=scale, out=out, workspace=ws)
        ms = bench_graph_ms(run, quick=dev.type != "cuda")
        kv_bytes = 2 * batch * ctx * HKV * D * kc.element_size()
        row = {"batch": batch, "context": ctx, "num_splits": plan.num_splits, "kv_bytes": kv_bytes, "ours_ms": ms,
               "ours_of_peak": kv_bytes / (ms * 1e-3) / (peak_tbs * 1e12)}
        if flashinfer is not None:
            row.update(_flashinfer_decode(flashinfer, args, {"max_query_len": 1, "scale": scale}, out, ms, False))
        if fa3 is not None:
            row.update(time_vllm_fa3(fa3, args, ctx, scale, out, ms))
        rows.append(row)
        peers = "".join(f", {name} {row[key] * 1e3:.1f} us" for name, key in
                        (("flashinfer", "flashinfer_ms"), ("vllm fa3", "vllm_fa3_ms")) if key in row)
        print(f"B={batch} ctx={ctx}: ours {ms * 1e3:.1f} us ({row['ours_of_peak']:.1%} of {peak_tbs} TB/s, "
              f"{plan.num_splits} splits){peers}", flush=True)
        del args, q, kc, vc, pt, ws, out
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def to_markdown(result: dict) -> str:
    peak = result["peak_tbs"]
    lines = [f"# Paged decode attention: ours, FlashInfer, vLLM FA3 ({result['device']}, commit {result['commit']})", "",
             f"Llama-3-8B heads (32 q / 8 kv, D 128), bf16, page {PAGE}, one query token; CUDA-graph replays, L2 "
             f"flushed; of peak = KV bytes / time over {peak} TB/s. `x` = our time over the peer's (< 1: ours "
             f"faster). FlashInfer: {result['flashinfer'] or 'not run'}; vLLM FA3: {result['vllm_fa3'] or 'not run'}.",
             "", "| batch | context | splits | ours (us) | of peak | FlashInfer (us) | x FI | vLLM FA3 (us) | x FA3 | "
             "rel err vs FA3 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        fi = (f"{r['flashinfer_ms'] * 1e3:.1f} | {r['ours_over_flashinfer']:.3f}" if "flashinfer_ms" in r
              else f"{r.get('flashinfer_error', '-')} | ")
        fa = (f"{r['vllm_fa3_ms'] * 1e3:.1f} | {r['ours_over_vllm_fa3']:.3f} | {r['rel_err_vs_vllm_fa3']:.1e}"
              if "vllm_fa3_ms" in r else f"{r.get('vllm_fa3_error', '-')} | | ")
        lines.append(f"| {r['batch']} | {r['context']} | {r['num_splits']} | {r['ours_ms'] * 1e3:.1f} | "
                     f"{r['ours_of_peak']:.1%} | {fi} | {fa} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=None, help="batch:context list (default: the served sweep's shapes)")
    ap.add_argument("--peak-tbs", type=float, default=4.27, help="HBM read peak (4.27 H200, 3.35 H100)")
    ap.add_argument("--no-flashinfer", action="store_true", help="leave FlashInfer out (its JIT build costs time)")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, ours only (checks the script)")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if dev.type == "cpu" and not args.smoke:
        print("no CUDA device: --smoke checks the script on the CPU interpreter", file=sys.stderr)
        return 2
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first Triton kernel is imported
    shapes = parse_shapes(args.shapes) if args.shapes else (SMOKE_SHAPES if args.smoke else SERVED_SHAPES)
    flashinfer, fi_note = None, None
    fa3, fa3_note = (None, "smoke run") if args.smoke else vllm_fa3()
    if not args.smoke and not args.no_flashinfer:
        try:
            from lightspeed_kernel.flashinfer import FlashInferPaged, load_library

            flashinfer = FlashInferPaged(load_library())
            fi_note = getattr(flashinfer.lib, "__version__", "?")
        except Exception as e:  # not installed: the table says so
            fi_note = f"not importable ({type(e).__name__})"
    if fa3 is not None:
        import vllm

        fa3_note = f"vllm {vllm.__version__}"
    rows = measure(shapes, dev, args.peak_tbs, flashinfer, fa3)
    device = device_name() if dev.type == "cuda" else "cpu-interpreter"
    result = {"device": device, "commit": args.commit or git_commit(), "torch": torch.__version__,
              "peak_tbs": args.peak_tbs, "flashinfer": fi_note, "vllm_fa3": fa3_note, "rows": rows}
    stem = result_stem(args.out, "decode_vs_peers", device)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(to_markdown(result))
    print(f"wrote {stem}.json/.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
