#!/usr/bin/env python
"""Paged prefill attention on the GPU: the registry's Triton kernel over a sweep of launch tiles, beside
torch's SDPA (FlashAttention-2 inside torch) on the same shapes with contiguous K/V.

Shapes are the ones serving runs: the chunks of a 20K-token first turn (8192-token chunks over 0, 8K
and 16K cached tokens), an agentic turn (800 new tokens over 22K cached) and the issue's grid
(4K / 16K / 32K new over 0 / 20K cached). Llama-3-8B heads (32 q / 8 kv, D 128), bf16, page 16.
Attention FLOPs count only visible (causal) pairs: 4 * D * Hq * (q * cached + q (q + 1) / 2).
Timed with triton.testing.do_bench (it flushes L2 between runs).

    python tools/bench/prefill_attention.py --out bench/results            # on the H200, ~3 minutes
    python tools/bench/prefill_attention.py --out /tmp/x --smoke           # CPU interpreter, tiny shapes
    python tools/bench/prefill_attention.py --out bench/results --flashinfer   # + FlashInfer (auto = FA3
        on sm_90, and FA2) on the same paged data, planned outside the timing (h200/flashinfer_setup.sh)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time

import torch
from result_files import git_commit, result_stem

PEAK_BF16_FLOPS = 810e12

# (cached tokens, new tokens): serving's chunks first, then the grid
SHAPES = [(0, 8192), (8192, 8192), (16384, 3616), (22000, 800), (0, 4096), (0, 16384), (20000, 4096),
          (20000, 16384), (0, 32768), (20000, 32768)]
SMOKE_SHAPES = [(0, 40), (37, 20)]
# (block_m, block_n, warps, stages[, pack_gqa[, warp_specialize]])
SWEEP = [(64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 4, 2), (64, 128, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2),
         (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (128, 32, 8, 3), (128, 64, 4, 3),
         # query heads packed per KV head (rows = tokens x heads of a group): not measured yet
         (128, 64, 4, 3, True), (128, 128, 8, 3, True), (64, 64, 4, 3, True), (256, 64, 8, 3, True),
         # the mask-free loop warp-specialised (Triton's autoWS on sm_90): not measured yet
         # (one warp group, 4 warps, does not compile with it: the consumers need two)
         (128, 128, 8, 2, False, True), (128, 128, 8, 3, False, True), (128, 64, 8, 2, False, True),
         (128, 64, 8, 3, False, True)]


def paged_case(cached: int, new: int, hq: int, hkv: int, d: int, page: int, dtype, dev, seed=0):
    """One request: its whole K/V (cached + new) stored in shuffled pages; q for the new tokens."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    total = cached + new
    pages = math.ceil(total / page)
    k = torch.randn(total, hkv, d, generator=g).to(dtype)
    v = torch.randn(total, hkv, d, generator=g).to(dtype)
    q = torch.randn(new, hq, d, generator=g).to(dtype)
    order = torch.randperm(pages + 3, generator=g)[:pages]
    k_cache = torch.zeros(pages + 3, page, hkv, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    pad = pages * page - total
    k_cache[order] = torch.cat([k, k.new_zeros(pad, hkv, d)]).view(pages, page, hkv, d)
    v_cache[order] = torch.cat([v, v.new_zeros(pad, hkv, d)]).view(pages, page, hkv, d)
    table = order.to(torch.int32).view(1, pages)
    qsl = torch.tensor([0, new], dtype=torch.int32)
    seq_lens = torch.tensor([total], dtype=torch.int32)
    to = dict(device=dev)
    return (q.to(**to), k_cache.to(**to), v_cache.to(**to), table.to(**to), qsl.to(**to), seq_lens.to(**to),
            k.to(**to), v.to(**to))


def causal_flops(cached: int, new: int, hq: int, d: int) -> float:
    return 4.0 * d * hq * (new * cached + new * (new + 1) / 2)


def sdpa_fn(q, k, v, cached: int, hq: int, hkv: int):
    """torch SDPA over contiguous K/V with the bottom-right causal mask (None where torch cannot)."""
    from torch.nn.attention.bias import causal_lower_right

    qh = q.transpose(0, 1).unsqueeze(0)                      # [1, Hq, new, D]
    kh = k.transpose(0, 1).unsqueeze(0).repeat_interleave(hq // hkv, dim=1)
    vh = v.transpose(0, 1).unsqueeze(0).repeat_interleave(hq // hkv, dim=1)
    if cached == 0:
        return lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    mask = causal_lower_right(qh.shape[2], kh.shape[2])
    return lambda: torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter run on tiny shapes (checks the script)")
    ap.add_argument("--no-sweep", action="store_true", help="the chosen tiles only")
    ap.add_argument("--sdpa-split", action="store_true",
                    help="also time sdpa_split_prefill (torch's fused attention, rectangle + square) with its "
                         "cudnn and flash backends")
    ap.add_argument("--ws-only", action="store_true",
                    help="sweep only the warp-specialised tiles (beside the chosen ones)")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated CACHED:NEW pairs instead of the default grid, e.g. 22000:800,8192:8192")
    ap.add_argument("--commit", default=None, help="commit measured (default: git's HEAD)")
    ap.add_argument("--baseline", default=None,
                    help="folder of an earlier lightspeed_kernel package copy (renamed, registration off): "
                         "its attention_prefill is timed beside, as the before of a change")
    ap.add_argument("--flashinfer", action="store_true",
                    help="time FlashInfer's paged prefill (backend auto = FA3 on sm_90, and fa2) beside ours")
    args = ap.parse_args(argv)

    from lightspeed_kernel.triton import attention_prefill as pre

    base = None
    if args.baseline:
        import importlib
        import sys
        from pathlib import Path

        folder = Path(args.baseline).resolve()
        sys.path.insert(0, str(folder.parent))
        base = importlib.import_module(f"{folder.name}.triton.attention_prefill")

    dev = "cpu" if args.smoke else "cuda"
    flashinfer = {}
    if args.flashinfer:
        from lightspeed_kernel.flashinfer import FlashInferPaged, load_library

        lib = load_library()
        flashinfer = {"flashinfer": FlashInferPaged(lib), "flashinfer_fa2": FlashInferPaged(lib, prefill_backend="fa2")}
    hq, hkv, d, page = (4, 2, 32, 16) if args.smoke else (32, 8, 128, 16)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    if args.smoke:
        def bench(fn):
            fn()
            return float("nan")
    else:
        import triton.testing

        def bench(fn):
            return triton.testing.do_bench(fn, warmup=10, rep=60)

    rows = []
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in pair.split(":")) for pair in args.shapes.split(",")]
    sweep = [t for t in SWEEP if not args.ws_only or (len(t) > 5 and t[5])]
    for cached, new in shapes:
        q, kc, vc, table, qsl, seq_lens, k, v = paged_case(cached, new, hq, hkv, d, page, dtype, dev)
        scale = d ** -0.5
        flops = causal_flops(cached, new, hq, d)
        want = pre.attention_prefill(q, kc, vc, table, qsl, seq_lens, max_query_len=new, scale=scale)
        chosen = pre.prefill_tiles(d, new, dtype)
        tiles = [chosen] + ([] if args.no_sweep or args.smoke else
                            [pre.PrefillTiles(*t) for t in sweep if pre.PrefillTiles(*t) != chosen])
        row = {"cached": cached, "new": new, "gflop": flops / 1e9, "chosen": list(vars(chosen).values()),
               "tiles": {}}
        for t in tiles:
            run = functools.partial(pre.launch_prefill, q, kc, vc, table, qsl, seq_lens, torch.empty_like(q), 1, hq,
                                    hkv, d, max_query_len=new, scale=scale, soft_cap=None, k_scale=None,
                                    v_scale=None, tiles=t)
            try:
                ms = bench(run)
                err = (run() - want).abs().max().item()
            except Exception as e:  # a tile that does not fit shared memory: recorded, not fatal
                row["tiles"][str(list(vars(t).values()))] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
                continue
            row["tiles"][str(list(vars(t).values()))] = {"ms": ms, "tflops": flops / ms / 1e9, "max_abs_diff": err}
        if base is not None:
            fn = functools.partial(base.attention_prefill, q, kc, vc, table, qsl, seq_lens, max_query_len=new,
                                   scale=scale)
            ms = bench(fn)
            row["baseline"] = {"ms": ms, "tflops": flops / ms / 1e9, "max_abs_diff": (fn() - want).abs().max().item()}
        for key, paged in flashinfer.items():
            try:  # prepare() plans (and JIT-compiles) outside the timing; the timed call only runs
                fn = paged.prepare("prefill", q, kc, vc, table, qsl, seq_lens, max_query_len=new, scale=scale,
                                   out=torch.empty_like(q))
                ms = bench(fn)
                row[key] = {"ms": ms, "tflops": flops / ms / 1e9,
                            "max_abs_diff": (fn().float() - want.float()).abs().max().item()}
            except Exception as e:  # a failed JIT build is part of the record
                row[key] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
        if args.sdpa_split:
            from lightspeed_kernel.sdpa import SplitPrefill

            for backend in ("cudnn", "flash"):
                split = SplitPrefill(backend)
                try:
                    fn = functools.partial(split, q, kc, vc, table, qsl, seq_lens, scale=scale, out=torch.empty_like(q))
                    if split._probe(q) is not None:
                        raise RuntimeError(split._probe(q))
                    # The first call of a shape: what serving pays for every new length (cuDNN builds a
                    # graph per shape on the host; warm timings below cannot show it).
                    first = time.perf_counter()
                    got = fn()
                    if dev == "cuda":
                        torch.cuda.synchronize()
                    first_ms = (time.perf_counter() - first) * 1e3
                    if got is None:
                        raise RuntimeError(split.failed)
                    ms = bench(fn)
                    row[f"sdpa_split_{backend}"] = {"ms": ms, "tflops": flops / ms / 1e9, "first_call_ms": first_ms,
                                                    "max_abs_diff": (got.float() - want.float()).abs().max().item()}
                except Exception as e:  # an unavailable backend is part of the record
                    row[f"sdpa_split_{backend}"] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
        if not args.smoke:
            try:
                fn = sdpa_fn(q, k, v, cached, hq, hkv)
                ms = bench(fn)
                got = fn()[0].transpose(0, 1)
                row["sdpa"] = {"ms": ms, "tflops": flops / ms / 1e9,
                               "max_abs_diff": (got.float() - want.float()).abs().max().item()}
            except Exception as e:
                row["sdpa"] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
        rows.append(row)
        best = max((v for v in row["tiles"].values() if "ms" in v), key=lambda v: v["tflops"], default=None)
        print(f"cached {cached:>6} new {new:>6}: chosen {row['tiles'].get(str(row['chosen']))} best {best} "
              f"sdpa {row.get('sdpa')} baseline {row.get('baseline')} flashinfer {row.get('flashinfer')} "
              f"fa2 {row.get('flashinfer_fa2')} sdpa_split {row.get('sdpa_split_cudnn')} / "
              f"{row.get('sdpa_split_flash')}", flush=True)

    device = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu-interpreter"
    result = {"device": device, "commit": args.commit or git_commit(), "torch": torch.__version__,
              "heads": [hq, hkv, d], "page": page, "dtype": str(dtype), "rows": rows}
    stem = result_stem(args.out, "prefill_attention", device)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(to_markdown(result))
    print(f"wrote {stem}.json/.md")
    return 0


def to_markdown(result: dict) -> str:
    lines = [f"# Paged prefill attention, {result['device']} (commit {result['commit']}, torch {result['torch']})",
             "", f"Heads {result['heads']} (q, kv, D), page {result['page']}, {result['dtype']}; TFLOP/s over "
             f"visible causal pairs; MFU vs {PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s.", "",
             "| cached | new | chosen tiles (m, n, warps, stages) | ms | TFLOP/s | MFU | best tiles | best TFLOP/s "
             "| SDPA ms | SDPA TFLOP/s | baseline ms | baseline TFLOP/s |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fi = any("flashinfer" in r for r in result["rows"])
    if fi:
        lines[-2] += " FlashInfer auto (FA3) ms | TFLOP/s | FlashInfer FA2 ms | TFLOP/s |"
        lines[-1] += "---|---|---|---|"
    split = any("sdpa_split_cudnn" in r for r in result["rows"])
    if split:
        lines[-2] += " SDPA split cuDNN ms | TFLOP/s | first call ms | SDPA split flash ms | TFLOP/s | first call ms |"
        lines[-1] += "---|---|---|---|---|---|"
    for r in result["rows"]:
        chosen = r["tiles"].get(str(r["chosen"]), {})
        timed = {k: v for k, v in r["tiles"].items() if "ms" in v}
        best_k = max(timed, key=lambda k: timed[k]["tflops"], default="-")
        best = timed.get(best_k, {})
        sd, bl = r.get("sdpa", {}), r.get("baseline", {})
        f = lambda x, p=2: "-" if x is None or x != x else f"{x:.{p}f}"  # noqa: E731
        lines.append(f"| {r['cached']} | {r['new']} | {r['chosen']} | {f(chosen.get('ms'), 3)} | "
                     f"{f(chosen.get('tflops'), 0)} | {f((chosen.get('tflops') or 0) / PEAK_BF16_FLOPS * 1e12 * 100, 0)}% | "
                     f"{best_k} | {f(best.get('tflops'), 0)} | {f(sd.get('ms'), 3)} | {f(sd.get('tflops'), 0)} | "
                     f"{f(bl.get('ms'), 3)} | {f(bl.get('tflops'), 0)} |")
        if fi:
            fa3, fa2 = r.get("flashinfer", {}), r.get("flashinfer_fa2", {})
            lines[-1] += "".join(f" {f(x.get('ms'), 3) if 'error' not in x else x['error'][:40]} | {f(x.get('tflops'), 0)} |"
                                 for x in (fa3, fa2))
        if split:
            lines[-1] += "".join(f" {f(x.get('ms'), 3) if 'error' not in x else x['error'][:40]} | {f(x.get('tflops'), 0)} "
                                 f"| {f(x.get('first_call_ms'), 1)} |"
                                 for x in (r.get("sdpa_split_cudnn", {}), r.get("sdpa_split_flash", {})))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
