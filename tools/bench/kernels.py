"""Kernel benchmarks of lightspeed_kernel's Triton kernels on one GPU (the H200 of DESIGN.md §9).

    python tools/bench/kernels.py --out bench/results [--commit SHA] [--quick]

Writes OUT/kernels_<date-time>_<device>.json (every measurement) and .md (tables). Reported:
- paged decode attention, Llama-3-8B heads (32 q / 8 kv, head dim 128), page 16 and 64, batch
  1/16/64/256, context 1K/8K/32K: achieved HBM bandwidth (KV bytes read / time) as a fraction of
  4.27 TB/s, and the speed ratio to torch SDPA on the same data gathered contiguous (GQA folded into
  the query axis, its best case: no K/V expansion, no mask);
- rms_norm, fused_add_rms_norm, silu_and_mul, rope, store_kv: bytes read + written / time;
- fused MoE at Qwen3-30B-A3B shapes (128 experts, top-8, hidden 2048, expert intermediate 768):
  time vs the reference per-expert loop, vs cuBLAS GEMMs of the same token rows through one expert
  (a dense lower bound on the arithmetic) and vs the bytes of the distinct active experts' weights;
- a sweep of decode tile configurations (block_n, warps, stages, splits) for tuning;
- with --flashinfer (flashinfer installed, tools/bench/h200/flashinfer_setup.sh): FlashInfer's paged
  decode on the same data beside ours in the decode table (its planned kernel in a CUDA graph, and
  eager with a fresh plan per call: what the first layer of an eager step pays, plan + host sync).
Timing: triton.testing.do_bench (CUDA events, L2 flushed between runs, median).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import platform
import subprocess
import sys
import time

import torch
from result_files import result_stem

HBM_BYTES_PER_S = 4.27e12  # DESIGN.md §9, measured H200 HBM read bandwidth


def bench_ms(fn, quick: bool) -> float:
    """Median time of fn() in ms."""
    if torch.cuda.is_available():
        import triton.testing

        return float(
            triton.testing.do_bench(
                fn, warmup=10 if quick else 25, rep=30 if quick else 100, return_mode="median"
            )
        )
    fn()  # CPU smoke mode (interpreter): correctness of the script only, never a figure to report
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def bench_graph_ms(fn, quick: bool) -> float:
    """Median time of one replay of a CUDA graph holding fn(): what a captured decode step pays,
    without Python launch overhead (which exceeds the GPU time of small launches)."""
    if not torch.cuda.is_available():
        return bench_ms(fn, quick)
    fn()  # compile outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench_ms(graph.replay, quick)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def measure_copy_bandwidth(dev, quick) -> dict:
    n = (1 << 28) if dev.type == "cuda" else (1 << 16)  # 1 GiB of fp32 on the GPU
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), quick)
    return {"bytes": 2 * src.numel() * 4, "ms": ms, "tb_per_s": 2 * src.numel() * 4 / ms / 1e9}


# ------------------------------------------------------------------------------------------------
# decode attention


def _decode_setup(batch, ctx, page_size, hq, hkv, d, dev, dtype=torch.bfloat16):
    pages_per_req = ctx // page_size
    num_pages = batch * pages_per_req + 1
    k_cache = torch.randn(num_pages, page_size, hkv, d, device=dev, dtype=dtype)
    v_cache = torch.randn(num_pages, page_size, hkv, d, device=dev, dtype=dtype)
    # shuffled pages, page 0 = padding never referenced
    perm = torch.randperm(num_pages - 1, device=dev).to(torch.int32) + 1
    page_table = perm.view(batch, pages_per_req).contiguous()
    q = torch.randn(batch, hq, d, device=dev, dtype=dtype)
    qsl = torch.arange(batch + 1, device=dev, dtype=torch.int32)
    seq_lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
    return q, k_cache, v_cache, page_table, qsl, seq_lens


def _sdpa_decode(q, k_cache, v_cache, page_table, hkv):
    """SDPA on the same data gathered into contiguous [B, Hkv, S, D]; the G query heads of a kv head
    become G query rows (exact for single-token decode: every row sees every key)."""
    import torch.nn.functional as F

    b, hq, d = q.shape
    k = k_cache[page_table.long()].flatten(1, 2).transpose(1, 2).contiguous()  # [B, Hkv, S, D]
    v = v_cache[page_table.long()].flatten(1, 2).transpose(1, 2).contiguous()
    qg = q.view(b, hkv, hq // hkv, d)
    scale = 1.0 / math.sqrt(d)
    return k, v, (lambda: F.scaled_dot_product_attention(qg, k, v, scale=scale)), qg


def _flashinfer_decode(paged, args, kw, ours, ms, quick) -> dict:
    """FlashInfer (a lightspeed_kernel.flashinfer.FlashInferPaged) on one decode case: graph replays of
    its planned kernel; eager plan + run with fresh metadata each call; agreement with our output."""
    fi_out = torch.empty_like(args[0])
    try:
        launch = paged.prepare("decode", *args, out=fi_out, **kw)  # plans (and JIT-compiles) here
        if launch is None:
            return {"flashinfer_error": "FlashInfer does not take this case"}
        fi_ms = bench_graph_ms(launch, quick)

        def replan():  # a new seq_lens tensor each call: a new plan, as every eager step's first layer
            return paged.prepare("decode", *args[:5], args[5].clone(), out=fi_out, **kw)()

        return {
            "flashinfer_ms": fi_ms,
            "flashinfer_plan_run_ms": bench_ms(replan, quick),
            "ours_over_flashinfer": ms / fi_ms,
            "rel_err_vs_flashinfer": rel_err(ours, fi_out),
        }
    except Exception as e:  # a failed JIT build or capture is part of the record
        return {"flashinfer_error": f"{type(e).__name__}: {str(e)[:200]}"}


def bench_decode(dev, quick, shapes, sweep_shapes, flashinfer=None) -> tuple[list, list]:
    from lightspeed_kernel.triton import attention_decode as dec

    hq, hkv, d = 32, 8, 128
    rows = []
    for page_size, batch, ctx in shapes:
        q, kc, vc, pt, qsl, sl = _decode_setup(batch, ctx, page_size, hq, hkv, d, dev)
        plan = dec.plan_decode(batch, hq, hkv, d, page_size, pt.shape[1], 1)
        ws = torch.empty(dec.decode_workspace_numel(plan, batch, hq, d), device=dev)
        out = torch.empty_like(q)
        scale = 1.0 / math.sqrt(d)
        run = functools.partial(
            dec.run_decode, plan, q, kc, vc, pt, qsl, sl, scale=scale, out=out, workspace=ws
        )
        ms = bench_graph_ms(run, quick)
        kv_bytes = 2 * batch * ctx * hkv * d * kc.element_size()
        row = {
            "page_size": page_size,
            "batch": batch,
            "context": ctx,
            "num_splits": plan.num_splits,
            "triton_ms": ms,
            "triton_eager_ms": bench_ms(run, quick),
            "kv_bytes": kv_bytes,
            "tb_per_s": kv_bytes / ms / 1e9,
            "hbm_fraction": kv_bytes / ms / 1e9 / (HBM_BYTES_PER_S / 1e12),
        }
        if flashinfer is not None:
            row.update(_flashinfer_decode(flashinfer, (q, kc, vc, pt, qsl, sl), {"max_query_len": 1, "scale": scale},
                                          out, ms, quick))
        try:
            k, v, sdpa, _ = _sdpa_decode(q, kc, vc, pt, hkv)
            ref = sdpa().reshape(batch, hq, d)
            row["rel_err_vs_sdpa"] = rel_err(out, ref)
            row["sdpa_ms"] = bench_graph_ms(sdpa, quick)
            row["speedup_vs_sdpa"] = row["sdpa_ms"] / ms
            del k, v, ref
        except torch.OutOfMemoryError:
            row["sdpa_ms"] = None
        rows.append(row)
        print(
            f"decode ps={page_size} B={batch} ctx={ctx}: {ms * 1e3:.1f} us, {row['hbm_fraction']:.1%} HBM, "
            f"splits={plan.num_splits}, vs sdpa x{row.get('speedup_vs_sdpa') or float('nan'):.2f}"
            + (f", flashinfer {row.get('flashinfer_ms', float('nan')) * 1e3:.1f} us {row.get('flashinfer_error', '')}"
               if flashinfer is not None else ""),
            flush=True,
        )
        del q, kc, vc, pt, ws, out
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    sweep = []
    for page_size, batch, ctx in sweep_shapes:
        q, kc, vc, pt, qsl, sl = _decode_setup(batch, ctx, page_size, hq, hkv, d, dev)
        kv_bytes = 2 * batch * ctx * hkv * d * kc.element_size()
        base = dec.plan_decode(batch, hq, hkv, d, page_size, pt.shape[1], 1)
        results = []
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3, 4) if batch <= 4 else (2, 3):
                    # small batches fill the GPU only through splits: try from half to 4x the planned count
                    for split_mult in (0.5, 1, 2, 3, 4) if batch <= 4 else (1, 2):
                        splits = max(1, round(base.num_splits * split_mult))
                        plan = dec.plan_decode(
                            batch,
                            hq,
                            hkv,
                            d,
                            page_size,
                            pt.shape[1],
                            1,
                            block_n=block_n,
                            num_warps=warps,
                            num_stages=stages,
                            num_splits=splits,
                        )
                        ws = torch.empty(dec.decode_workspace_numel(plan, batch, hq, d), device=dev)
                        try:
                            ms = bench_graph_ms(
                                functools.partial(
                                    dec.run_decode, plan, q, kc, vc, pt, qsl, sl, scale=0.088, workspace=ws
                                ),
                                True,
                            )
                        except Exception as e:  # e.g. out of shared memory for a tile/stage combination
                            results.append(
                                {
                                    "block_n": block_n,
                                    "warps": warps,
                                    "stages": stages,
                                    "splits": plan.num_splits,
                                    "error": type(e).__name__,
                                }
                            )
                            continue
                        results.append(
                            {
                                "block_n": block_n,
                                "warps": warps,
                                "stages": stages,
                                "splits": plan.num_splits,
                                "ms": ms,
                                "hbm_fraction": kv_bytes / ms / 1e9 / (HBM_BYTES_PER_S / 1e12),
                            }
                        )
        ok = [r for r in results if "ms" in r]
        best = min(ok, key=lambda r: r["ms"]) if ok else None
        sweep.append(
            {
                "page_size": page_size,
                "batch": batch,
                "context": ctx,
                "default_splits": base.num_splits,
                "best": best,
                "all": results,
            }
        )
        print(f"sweep ps={page_size} B={batch} ctx={ctx}: best {best}", flush=True)
        del q, kc, vc, pt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows, sweep


# ------------------------------------------------------------------------------------------------
# RoPE + KV store: two launches per layer against the fused one


def bench_rope_store(dev, quick, token_counts=(1, 16, 64, 2048), layers=32) -> list:
    """Per layer, as a captured step runs them: `layers` back-to-back repetitions in one CUDA graph
    (so launch gaps count as in a decode step), Llama-3-8B heads, bf16, page 16."""
    from lightspeed_kernel.reference import rope as ref_rope
    from lightspeed_kernel.triton import kv_store, rope

    rows = []
    cache = ref_rope.rope_cos_sin_cache(128, 131072, 500000.0, device=dev)
    for t in token_counts:
        qkv = torch.randn(t, 48 * 128, device=dev, dtype=torch.bfloat16)
        q, k, v = qkv[:, :4096].view(t, 32, 128), qkv[:, 4096:5120].view(t, 8, 128), qkv[:, 5120:].view(t, 8, 128)
        pos = torch.randint(0, 131072, (t,), device=dev)
        kc = torch.zeros(max(64, t // 16 + 2), 16, 8, 128, device=dev, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        slots = torch.randperm((kc.shape[0] - 1) * 16, device=dev)[:t] + 16

        def separate(pos=pos, q=q, k=k, v=v, kc=kc, vc=vc, slots=slots):  # bound now: timed in this iteration
            for _ in range(layers):
                rope.apply_rope(pos, q, k, cache)
                kv_store.store_kv(k, v, kc, vc, slots)

        def fused(pos=pos, q=q, k=k, v=v, kc=kc, vc=vc, slots=slots):
            for _ in range(layers):
                kv_store.rope_store_kv(pos, q, k, v, cache, kc, vc, slots)

        sep, fus = bench_graph_ms(separate, quick) / layers, bench_graph_ms(fused, quick) / layers
        rows.append({"tokens": t, "separate_ms": sep, "fused_ms": fus, "saved_us_per_layer": (sep - fus) * 1e3})
        print(f"rope+store T={t}: separate {sep * 1e3:.2f} us, fused {fus * 1e3:.2f} us per layer", flush=True)
    return rows


# ------------------------------------------------------------------------------------------------
# elementwise ops


def bench_elementwise(dev, quick, tokens) -> list:
    from lightspeed_kernel.reference import rope as ref_rope
    from lightspeed_kernel.triton import activation, kv_store, norm, rope

    dt = torch.bfloat16
    rows = []

    def add(name, shape, nbytes, fn):
        ms = bench_graph_ms(fn, quick)
        rows.append(
            {
                "op": name,
                "shape": shape,
                "bytes": nbytes,
                "ms": ms,
                "tb_per_s": nbytes / ms / 1e9,
                "hbm_fraction": nbytes / ms / 1e9 / (HBM_BYTES_PER_S / 1e12),
            }
        )
        print(f"{name} {shape}: {ms * 1e3:.1f} us, {rows[-1]['hbm_fraction']:.1%} HBM", flush=True)

    h = 4096
    x = torch.randn(tokens, h, device=dev, dtype=dt)
    res = torch.randn_like(x)
    w = torch.randn(h, device=dev, dtype=dt)
    out = torch.empty_like(x)
    add("rms_norm", [tokens, h], 2 * x.numel() * 2, lambda: norm.rms_norm(x, w, 1e-6, out=out))
    # reads x and residual, writes residual and out
    add(
        "fused_add_rms_norm", [tokens, h], 4 * x.numel() * 2, lambda: norm.fused_add_rms_norm(x, res, w, 1e-6)
    )
    for warps in (4, 16):  # the default is 8 warps for H = 4096
        add(
            f"rms_norm sweep warps={warps}",
            [tokens, h],
            2 * x.numel() * 2,
            lambda warps=warps: norm._launch(x, None, w, 1e-6, out, num_warps=warps),
        )
        add(
            f"fused_add_rms_norm sweep warps={warps}",
            [tokens, h],
            4 * x.numel() * 2,
            lambda warps=warps: norm._launch(x, res, w, 1e-6, out, num_warps=warps),
        )
    inter = 14336
    g = torch.randn(tokens // 2, 2 * inter, device=dev, dtype=dt)
    gout = torch.empty(tokens // 2, inter, device=dev, dtype=dt)
    add(
        "silu_and_mul",
        [tokens // 2, 2 * inter],
        3 * gout.numel() * 2,
        lambda: activation.silu_and_mul(g, out=gout),
    )
    hq, hkv, d = 32, 8, 128
    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, device=dev, dtype=dt)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(tokens, hkv, d)
    cache = ref_rope.rope_cos_sin_cache(d, 8192, 500000.0, device=dev)
    pos = torch.randint(0, 8192, (tokens,), device=dev)
    add(
        "rope (neox, q+k in place)",
        [tokens, hq + hkv, d],
        2 * tokens * (hq + hkv) * d * 2 + tokens * d * 4,
        lambda: rope.apply_rope(pos, q, k, cache),
    )
    kv = torch.randn(2, tokens, hkv, d, device=dev, dtype=dt)
    page_size = 16
    pages = tokens // page_size + 1
    kc = torch.empty(pages, page_size, hkv, d, device=dev, dtype=dt)
    vc = torch.empty_like(kc)
    slots = torch.randperm(tokens, device=dev) + page_size
    add(
        "store_kv (page 16)",
        [tokens, hkv, d],
        2 * 2 * kv[0].numel() * 2,
        lambda: kv_store.store_kv(kv[0], kv[1], kc, vc, slots),
    )
    for tpp in (1, 4, 8):  # default: 2 tokens per program, 4 warps
        for warps in (2, 4, 8):
            add(
                f"store_kv sweep tokens/program={tpp} warps={warps}",
                [tokens, hkv, d],
                2 * 2 * kv[0].numel() * 2,
                lambda tpp=tpp, warps=warps: kv_store.store_kv(
                    kv[0], kv[1], kc, vc, slots, _tokens_per_program=tpp, _num_warps=warps
                ),
            )
    return rows


# ------------------------------------------------------------------------------------------------
# fused MoE


def _dense_pair(xs, hs, w13_e, w2_e):
    return xs @ w13_e.t(), hs @ w2_e.t()


MOE_SWEEP_TILES = [  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
    (16, 64, 128, 4, 4),
    (16, 64, 64, 4, 3),
    (16, 128, 64, 4, 3),
    (16, 32, 128, 4, 4),
    (16, 64, 128, 4, 2),
    (16, 128, 128, 8, 3),
    (32, 64, 64, 4, 4),
    (32, 128, 64, 4, 4),
    (64, 128, 64, 8, 3),
    (64, 64, 64, 4, 3),
]


def bench_moe(dev, quick, batches, experts=128, top_k=8, hidden=2048, inter=768, sweep_tiles=()) -> list:
    from lightspeed_kernel.reference import moe as ref_moe
    from lightspeed_kernel.triton import fused_moe

    dt = torch.bfloat16
    w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dt) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device=dev, dtype=dt) / inter**0.5
    rows = []
    for t in batches:
        x = torch.randn(t, hidden, device=dev, dtype=dt)
        weights, ids = ref_moe.moe_topk(torch.randn(t, experts, device=dev), top_k)
        fused = functools.partial(fused_moe.fused_experts, x, w13, w2, weights, ids)
        ms = bench_graph_ms(fused, quick)
        eager_ms = bench_ms(fused, quick)
        err = rel_err(fused(), ref_moe.fused_experts(x, w13, w2, weights, ids))
        ref_ms = bench_ms(functools.partial(ref_moe.fused_experts, x, w13, w2, weights, ids), quick)
        # dense lower bound: the same T*k rows through one expert's weights with cuBLAS
        xs = torch.randn(t * top_k, hidden, device=dev, dtype=dt)
        hs = torch.randn(t * top_k, inter, device=dev, dtype=dt)
        dense_ms = bench_graph_ms(functools.partial(_dense_pair, xs, hs, w13[0], w2[0]), quick)
        active = int(torch.unique(ids).numel())
        weight_bytes = active * 3 * hidden * inter * 2
        sweep = []
        if sweep_tiles and t in (1, 16, 256):
            for tiles in sweep_tiles:
                try:
                    tms = bench_graph_ms(
                        functools.partial(fused_moe.fused_experts, x, w13, w2, weights, ids, _tiles=tiles),
                        True,
                    )
                    sweep.append({"tiles": list(tiles), "ms": tms})
                except Exception as e:  # a tile/stage combination over the shared-memory budget
                    sweep.append({"tiles": list(tiles), "error": type(e).__name__})
        best = min((r for r in sweep if "ms" in r), key=lambda r: r["ms"], default=None)
        rows.append(
            {
                "batch": t,
                "active_experts": active,
                "triton_ms": ms,
                "triton_eager_ms": eager_ms,
                "tile_sweep": sweep,
                "best_tiles": best,
                "reference_ms": ref_ms,
                "dense_gemm_ms": dense_ms,
                "speedup_vs_reference": ref_ms / ms,
                "ratio_to_dense": ms / dense_ms,
                "weight_bytes": weight_bytes,
                "weight_roofline_ms": weight_bytes / HBM_BYTES_PER_S * 1e3,
                "hbm_fraction": weight_bytes / (ms / 1e3) / HBM_BYTES_PER_S,
                "rel_err": err,
            }
        )
        print(
            f"moe T={t}: {ms * 1e3:.1f} us (eager {eager_ms * 1e3:.1f}, best tiles {best}, "
            f"ref {ref_ms * 1e3:.0f} us, dense {dense_ms * 1e3:.1f} us, "
            f"{active} experts, {rows[-1]['hbm_fraction']:.1%} of weight roofline) err {err:.1e}",
            flush=True,
        )
    return rows


# ------------------------------------------------------------------------------------------------


def _best_tiles(row: dict) -> str:
    best = row.get("best_tiles")
    return "" if not best else f"{tuple(best['tiles'])}: {best['ms'] * 1e3:.1f}"


def to_markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"# Kernel benchmarks — {meta['device']}",
        "",
        f"date {meta['date']}, commit {meta['commit']}, torch {meta['torch']}, triton {meta['triton']}; "
        f"HBM reference {HBM_BYTES_PER_S / 1e12:.2f} TB/s; measured copy "
        f"{result['copy_bandwidth']['tb_per_s']:.2f} TB/s (read + write).",
        "",
    ]
    fi_cols = any("flashinfer_ms" in r or "flashinfer_error" in r for r in result.get("decode", []))
    lines += [
        "## Paged decode attention (Llama-3-8B: 32 q / 8 kv heads, D 128, bf16, 1 query token)",
        "",
        "Times are CUDA-graph replays (as decode runs in the engine); eager adds Python launch overhead."
        + (" FlashInfer: its planned kernel replayed in a graph; `plan+run` is eager with a fresh plan per "
           "call (host sync included); `ours / FI` < 1 means ours is faster." if fi_cols else ""),
        "",
        "| page | batch | context | splits | time (us) | eager (us) | TB/s | HBM fraction | SDPA (us) | x SDPA | rel err vs SDPA |"
        + (" FlashInfer (us) | ours / FI | FI plan+run eager (us) | rel err vs FI |" if fi_cols else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if fi_cols else ""),
    ]
    for r in result.get("decode", []):
        sd = r.get("sdpa_ms")
        sdpa_us = "" if sd is None else f"{sd * 1e3:.1f}"
        speedup = "" if sd is None else f"{r['speedup_vs_sdpa']:.2f}"
        fi = ""
        if fi_cols and "flashinfer_ms" in r:
            fi = (f" {r['flashinfer_ms'] * 1e3:.1f} | {r['ours_over_flashinfer']:.2f} | "
                  f"{r['flashinfer_plan_run_ms'] * 1e3:.1f} | {r['rel_err_vs_flashinfer']:.1e} |")
        elif fi_cols:
            fi = f" {r.get('flashinfer_error', '')} | | | |"
        lines.append(
            f"| {r['page_size']} | {r['batch']} | {r['context']} | {r['num_splits']} | "
            f"{r['triton_ms'] * 1e3:.1f} | {r.get('triton_eager_ms', float('nan')) * 1e3:.1f} | "
            f"{r['tb_per_s']:.2f} | {r['hbm_fraction']:.1%} | {sdpa_us} | {speedup} | {r.get('rel_err_vs_sdpa', float('nan')):.1e} |"
            + fi
        )
    if result.get("decode_sweep"):
        lines += [
            "",
            "### Decode tile sweep (best of block_n x warps x stages x splits)",
            "",
            "| page | batch | context | default splits | best config | HBM fraction |",
            "|---|---|---|---|---|---|",
        ]
        for s in result["decode_sweep"]:
            b = s["best"] or {}
            cfg = f"block_n {b.get('block_n')}, warps {b.get('warps')}, stages {b.get('stages')}, splits {b.get('splits')}"
            lines.append(
                f"| {s['page_size']} | {s['batch']} | {s['context']} | {s['default_splits']} | {cfg} | "
                f"{b.get('hbm_fraction', float('nan')):.1%} |"
            )
    lines += [
        "",
        "## Elementwise ops (bf16; bytes read + written; CUDA-graph replays)",
        "",
        "| op | shape | time (us) | TB/s | HBM fraction |",
        "|---|---|---|---|---|",
    ]
    for r in result.get("elementwise", []):
        lines.append(
            f"| {r['op']} | {r['shape']} | {r['ms'] * 1e3:.1f} | {r['tb_per_s']:.2f} | {r['hbm_fraction']:.1%} |"
        )
    lines += [
        "",
        "## Fused MoE (Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, intermediate 768, bf16)",
        "",
        "Triton and dense times are CUDA-graph replays; the reference loop syncs with the host and runs eager. "
        "Dense bound: cuBLAS GEMMs of the same T*k rows through one expert (arithmetic only); roofline: "
        "bytes of the distinct active experts' weights at 4.27 TB/s.",
        "",
        "| batch | active experts | triton (us) | reference loop (us) | x reference | dense GEMM bound (us) | "
        "triton / dense | weight-bytes roofline (us) | of roofline | rel err | best swept tiles (us) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result.get("moe", []):
        lines.append(
            f"| {r['batch']} | {r['active_experts']} | {r['triton_ms'] * 1e3:.1f} | {r['reference_ms'] * 1e3:.0f} | "
            f"{r['speedup_vs_reference']:.1f} | {r['dense_gemm_ms'] * 1e3:.1f} | {r['ratio_to_dense']:.2f} | "
            f"{r['weight_roofline_ms'] * 1e3:.1f} | {r['hbm_fraction']:.1%} | {r['rel_err']:.1e} | "
            f"{_best_tiles(r)} |"
        )
    if result.get("rope_store"):
        lines += [
            "",
            "## RoPE + KV store per attention layer (Llama-3-8B heads, bf16; 32 layers in one CUDA graph)",
            "",
            "| tokens | apply_rope + store_kv (us) | rope_store_kv fused (us) | saved per layer (us) |",
            "|---|---|---|---|",
        ]
        for r in result["rope_store"]:
            lines.append(f"| {r['tokens']} | {r['separate_ms'] * 1e3:.2f} | {r['fused_ms'] * 1e3:.2f} | "
                         f"{r['saved_us_per_layer']:.2f} |")
    for name, err in result.get("errors", {}).items():
        lines += ["", f"**{name} failed:** `{err}`"]
    return "\n".join(lines) + "\n"


def write(out: str, result: dict) -> None:
    """out is a folder: the run's files are named by date-time and device (never overwritten)."""
    out = str(result_stem(out, "kernels", result.get("device")))
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(to_markdown(result))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (kernels_<date-time>_<device>.json/.md are written)")
    ap.add_argument(
        "--commit", default=None, help="git commit of the code measured (default: git rev-parse HEAD)"
    )
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no tile sweep")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny shapes on CPU (TRITON_INTERPRET=1): checks the script"
    )
    ap.add_argument("--no-sweep", action="store_true", help="no tile sweeps at all")
    ap.add_argument("--no-decode-sweep", action="store_true", help="skip the decode tile sweep (the slowest)")
    ap.add_argument("--decode-sweep-only", default=None, metavar="PAGE:BATCH:CONTEXT,...",
                    help="only the decode tile sweep, over these shapes (e.g. 16:1:8192,16:1:32768)")
    ap.add_argument("--flashinfer", action="store_true",
                    help="time FlashInfer's paged decode beside ours (needs flashinfer and a GPU)")
    args = ap.parse_args(argv)

    import triton

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and not args.smoke:
        print(
            "no CUDA device: run with --smoke (TRITON_INTERPRET=1) to check the script only", file=sys.stderr
        )
        return 2
    flashinfer = None
    if args.flashinfer:
        if dev.type != "cuda":
            print("--flashinfer needs a CUDA device", file=sys.stderr)
            return 2
        from lightspeed_kernel.flashinfer import FlashInferPaged, load_library

        flashinfer = FlashInferPaged(load_library())
    commit = args.commit
    if commit is None:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "device": torch.cuda.get_device_name()
        if dev.type == "cuda"
        else f"cpu smoke ({platform.processor()})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "hbm_reference_tb_per_s": HBM_BYTES_PER_S / 1e12,
        "flashinfer": getattr(flashinfer.lib, "__version__", "?") if flashinfer is not None else None,
    }
    if args.smoke:
        decode_shapes = [(16, 2, 64), (64, 1, 128)]
        sweep_shapes = []
        tokens, moe_batches, moe_kw = 64, [1, 4], {"experts": 8, "top_k": 2, "hidden": 64, "inter": 32}
    else:
        decode_shapes = [(ps, b, c) for ps in (16, 64) for b in (1, 16, 64, 256) for c in (1024, 8192, 32768)]
        sweep_shapes = (
            []
            if (args.quick or args.no_sweep or args.no_decode_sweep)
            else [(16, 1, 8192), (16, 1, 32768), (16, 16, 8192), (16, 64, 8192), (16, 256, 32768)]
        )
        tokens, moe_batches, moe_kw = 16384, [1, 4, 16, 64, 256], {}
    if args.decode_sweep_only:
        try:
            sweep_shapes = [tuple(int(x) for x in shape.split(":")) for shape in args.decode_sweep_only.split(",")]
        except ValueError:
            sweep_shapes = []
        if not sweep_shapes or any(len(shape) != 3 or min(shape) < 1 for shape in sweep_shapes):
            print(f"--decode-sweep-only wants PAGE:BATCH:CONTEXT,... got {args.decode_sweep_only!r}", file=sys.stderr)
            return 2
    torch.manual_seed(0)
    result = {"meta": meta, "copy_bandwidth": measure_copy_bandwidth(dev, args.quick), "errors": {}}
    print(f"copy bandwidth {result['copy_bandwidth']['tb_per_s']:.2f} TB/s", flush=True)
    sections = [] if args.decode_sweep_only else [
        ("decode", lambda: bench_decode(dev, args.quick, decode_shapes, [], flashinfer)[0]),
        ("elementwise", lambda: bench_elementwise(dev, args.quick, tokens)),
        (
            "moe",
            lambda: bench_moe(
                dev,
                args.quick,
                moe_batches,
                **moe_kw,
                sweep_tiles=() if (args.smoke or args.no_sweep) else MOE_SWEEP_TILES,
            ),
        ),
    ]
    sections.append(("rope_store", lambda: bench_rope_store(dev, args.quick, (1, 16) if args.smoke else (1, 16, 64, 2048))))
    sections.append(("decode_sweep", lambda: bench_decode(dev, True, [], sweep_shapes)[1]))
    for name, fn in sections:
        try:
            result[name] = fn()
        except Exception as e:  # keep what was measured; the error is part of the record
            result[name] = []
            result["errors"][name] = f"{type(e).__name__}: {e}"
            print(f"{name} failed: {result['errors'][name]}", flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        write(args.out, result)  # after every section: a run cut short keeps what it measured
    print(to_markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
