"""MLA kernel benchmark on one GPU: decode sweep, fold on/off, the seeds' cases, prefill.

    python tools/bench/mla.py --out DIR [--budget-s 150] [--tile-sweep] [--flashinfer]

Writes DIR/mla_bench_<date-time>_<device>.json and .md. Every figure is measured here: µs per call
(median of CUDA-graph replays, each after a 256 MiB write that flushes the L2, timed by CUDA events
around the replay alone), achieved HBM bandwidth as a fraction of 4.27 TB/s counting only what a
perfect kernel must move (the cached tokens once, the queries read and the outputs written once;
split-KV partials are the kernel's overhead, not bandwidth achieved), TFLOP/s, and the fraction of
the point's roofline max(bytes / 4.27 TB/s, FLOPs / MMA peak): absorbed MLA costs 2176 FLOP per
query row per cached token, so many heads x query tokens make a point compute-bound (the MMA peak
is 810 TFLOP/s bf16; FP8 caches are judged against FP8 MMAs at twice that).
Points run in priority order (targets first) until --budget-s is spent; what did not run is listed.
--candidates mla_decode_triton,mla_decode_sm90 times each named `mla/decode` kernel of the registry on
every decode point (through its plan / run, from a CUDA graph), one row per kernel, each row's err against
the first candidate's output; --points seeds | small | all picks the points (small: the seeds' case and a
16-point grid: q_len 1 / 4, heads 16 / 128, 16K / 80K, batch 16 and 1).
--flashinfer puts FlashInfer's MLA decode beside ours on each point (timed the same way, on the same
queries and pages, its output checked against ours; see FlashInferColumn); without the library the
table says why and the rest runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
from result_files import result_stem

HBM_BPS = 4.27e12
BF16_FLOPS = 810e12
MMA_FLOPS = {"bf16": BF16_FLOPS, "fp8": 2 * BF16_FLOPS}  # wgmma e4m3 runs at twice the bf16 rate
D_QK, D_V = 576, 512  # absorbed MLA: queries against latent ‖ rope, values = the latent
FLUSH_BYTES = 256 << 20  # more than the H200's L2 (50 MiB), written before each timed replay
SCALE = 192**-0.5  # DeepSeek's softmax scale (qk head dim 192)


def decode_cost(kind: str, batch: int, heads: int, q_len: int, ctx: int, bytes_per_token: int) -> dict:
    """What a perfect decode kernel must do for one point: read every cached token once, read the
    bf16 queries and write the bf16 outputs once; 2 · (576 + 512) FLOP per query row per token."""
    kv_bytes = batch * ctx * bytes_per_token
    nbytes = kv_bytes + batch * q_len * heads * (D_QK + D_V) * 2
    flops = 2 * (D_QK + D_V) * batch * heads * q_len * ctx
    memory_us, compute_us = nbytes / HBM_BPS * 1e6, flops / MMA_FLOPS[kind] * 1e6
    return {"bytes": nbytes, "flops": flops, "roofline_us": max(memory_us, compute_us),
            "bound": "compute" if compute_us > memory_us else "memory"}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - the device copy of the tree may have no .git
        return "unknown"


_flush_buffer: torch.Tensor | None = None


def _time_us(fn, reps: int = 20) -> float:
    """Median µs of `fn` replayed from a CUDA graph (eager if it cannot be captured), the L2 flushed
    before each replay and only the replay between the events."""
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    run = fn
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception:  # noqa: BLE001 - fall back to eager launches
        torch.cuda.synchronize()
    run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        _flush_buffer.zero_()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return times[reps // 2] * 1e3


def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth and an 8192^3 bf16 GEMM, for the record."""
    import triton.testing as tt

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    y = torch.empty_like(x)
    ms = tt.do_bench(lambda: y.copy_(x), warmup=5, rep=30, return_mode="median")
    copy_tbps = 2 * x.numel() / ms / 1e9
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = tt.do_bench(lambda: a @ b, warmup=5, rep=30, return_mode="median")
    x = y = None  # free the 2 GiB before the sweep allocates its caches
    return {"copy_TBps_read_plus_write": round(copy_tbps, 3), "bf16_gemm_TFLOPs": round(2 * 8192**3 / ms / 1e9, 1)}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


class FlashInferColumn:
    """FlashInfer's MLA decode (lightspeed_mla.flashinfer_mla) on each point's inputs, or why it cannot run.

    bf16 points read our packed cache (views, no copy). FlashInfer cannot read our FP8 cache (bf16 rope,
    one latent scale a token), so FP8 points run its own FP8 format made from ours once
    (`fp8_format_copy`: e4m3 rope with one scale, 592 B a token against our 644); their fraction is of
    the point's roofline for our format, so compare the µs. `err` is FlashInfer's output against ours.
    """

    def __init__(self, load=None, backend: str | None = None):
        try:
            from lightspeed_mla import flashinfer_mla

            lib = (load or flashinfer_mla.load_library)()
        except Exception as e:  # noqa: BLE001 - not installed, a broken install, an old version: say which
            self.runner, self.why = None, f"{type(e).__name__}: {e}"[:300]
            self.info = {"why": self.why}
            return
        self.fim, self.why = flashinfer_mla, None
        self.runner = flashinfer_mla.FlashInferMLA(lib, backend=backend)
        self.info = {"version": getattr(sys.modules.get("flashinfer"), "__version__", "?"),
                     "backend": backend or "fa3 on sm_90, else fa2"}
        self._fp8_copies: dict[int, object] = {}

    def measure(self, kind, cache, page_table, qsl, lens, q, ours, ours_us, roofline_us, time_fn) -> dict:
        """fi_us, fi_of_roofline, fi_speedup (ours µs / FlashInfer µs), fi_err, fi_backend, fi_graph; or
        fi_error."""
        if self.runner is None:
            return {}  # the table's header says why
        try:
            kv = cache
            if kind == "fp8":
                if id(cache) not in self._fp8_copies:
                    self._fp8_copies[id(cache)] = self.fim.fp8_format_copy(cache)
                kv = self._fp8_copies[id(cache)]
            plan = self.runner.plan(qsl, lens, page_table, q.shape[1], page_size=cache.page_size, softmax_scale=SCALE,
                                    kv_dtype=torch.float8_e4m3fn if kind == "fp8" else torch.bfloat16)
            out, capturing = torch.empty_like(ours), []

            def call():
                capturing.append(q.is_cuda and torch.cuda.is_current_stream_capturing())
                self.runner.run(plan, q, kv, out)

            us = time_fn(call)
            err = rel_err(out, ours)
        except Exception as e:  # noqa: BLE001 - a point FlashInfer fails is a result too
            return {"fi_error": f"{type(e).__name__}: {e}"[:200]}
        return {"fi_us": round(us, 2), "fi_of_roofline": round(roofline_us / us, 3),
                "fi_speedup": round(ours_us / us, 2), "fi_err": round(err, 4), "fi_backend": plan.backend,
                "fi_graph": capturing[-1]}  # timed from a CUDA graph (the last call was its capture), else eager


class DecodePoint(NamedTuple):
    cache: object
    page_table: torch.Tensor
    qsl: torch.Tensor
    lens: torch.Tensor
    q: torch.Tensor
    out: torch.Tensor


class DecodeBench:
    """One big cache per kind; each point takes random pages of it. `time_fn(fn) -> µs`."""

    def __init__(self, max_tokens: int, page_size: int = 64, time_fn=_time_us):
        from lightspeed_mla import MLACache

        self.page_size, self.time_fn = page_size, time_fn
        self.num_pages = max_tokens // page_size
        self.caches = {}
        for kind in ("bf16", "fp8"):
            c = MLACache.empty(self.num_pages, page_size, kind, device="cuda")
            if kind == "bf16":
                c.packed.normal_()
            else:
                # Random finite e4m3 bit patterns: clearing the exponent's low bit rules out NaN (0x7F).
                c.latent.view(torch.uint8).random_(0, 256)
                c.latent.view(torch.uint8).bitwise_and_(0xF7)
                c.scale.uniform_(0.001, 0.01)
                c.rope.normal_()
            self.caches[kind] = c
        self.ws = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")

    def point(self, kind, batch, heads, q_len, ctx, seed: int | None = None) -> DecodePoint:
        """One point's inputs: random pages of the kind's cache, `ctx` keys and `q_len` query tokens for each
        of `batch` requests (seed fixes them, so kernels timed on one point see the same inputs)."""
        if seed is not None:
            torch.manual_seed(seed)
        pages_per = -(-ctx // self.page_size)
        perm = torch.randperm(self.num_pages, device="cuda")[: batch * pages_per]
        T = batch * q_len
        return DecodePoint(
            cache=self.caches[kind], page_table=perm.view(batch, pages_per).to(torch.int32),
            qsl=torch.arange(batch + 1, dtype=torch.int32) * q_len, lens=torch.full((batch,), ctx, dtype=torch.int32),
            q=torch.randn(T, heads, 576, device="cuda").to(torch.bfloat16),
            out=torch.empty(T, heads, 512, device="cuda", dtype=torch.bfloat16))

    def run(self, kind, batch, heads, q_len, ctx, fold=None, tile=None, flashinfer: FlashInferColumn | None = None,
            impl=None, seed: int | None = None):
        """impl: a registry `mla/decode` impl with plan / run (None: plan_decode / run_decode). seed fixes
        the pages and queries, so candidates timed on one point see the same inputs."""
        from lightspeed_mla import plan_decode, run_decode

        pt = self.point(kind, batch, heads, q_len, ctx, seed)
        cache, page_table, qsl, lens, q, out = pt.cache, pt.page_table, pt.qsl, pt.lens, pt.q, pt.out
        plan_fn, run_fn = (plan_decode, run_decode) if impl is None else (impl.plan, impl.run)
        # An impl with `bind` gets the engine's graph path: planned as captured, bound to the point's
        # device metadata, and (a host-planned one, e.g. mla_decode_flashinfer) re-planned on the host once.
        graph_path = {"captured": True} if hasattr(impl, "bind") else {}
        plan = plan_fn(self.ws, qsl, lens, heads, page_size=self.page_size, softmax_scale=SCALE,
                       cache_kind=kind, fold=fold, tile=tile, **graph_path)
        if graph_path:
            plan = impl.bind(plan, qsl.cuda(), lens.cuda(), page_table)
            if hasattr(plan, "replan"):
                from lightspeed_kernel.ops import HostLengths

                plan.replan(HostLengths(qsl.numpy(), lens.numpy()))
        us = self.time_fn(lambda: run_fn(plan, q, cache, page_table, out))
        self.last_out = out
        cost = decode_cost(kind, batch, heads, q_len, ctx, cache.bytes_per_token)
        t = getattr(plan, "tile", None)  # a FlashInfer plan has no tile, fold or split count of ours
        row = {
            "kind": kind, "batch": batch, "heads": heads, "q_len": q_len, "ctx": ctx, "us": round(us, 2),
            "hbm_frac": round(cost["bytes"] / (us * 1e-6) / HBM_BPS, 3),
            "tflops": round(cost["flops"] / (us * 1e-6) / 1e12, 1),
            "roofline_us": round(cost["roofline_us"], 2), "of_roofline": round(cost["roofline_us"] / us, 3),
            "bound": cost["bound"], "fold": getattr(plan, "fold", None), "splits": getattr(plan, "num_splits", None),
            "tile": f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}{' swap' if t.swap_ab else ''}" if t else "-",
        }
        if flashinfer is not None:
            row.update(flashinfer.measure(kind, cache, page_table, qsl, lens, q, out, us, cost["roofline_us"],
                                          self.time_fn))
        return row


def prefill_point(q_len=8192, kv_len=8192, heads=128, tile=None) -> dict:
    from lightspeed_mla.prefill import mla_prefill

    dev = "cuda"
    q_nope = torch.randn(q_len, heads, 128, device=dev, dtype=torch.bfloat16)
    q_rope = torch.randn(q_len, heads, 64, device=dev, dtype=torch.bfloat16)
    k_nope = torch.randn(kv_len, heads, 128, device=dev, dtype=torch.bfloat16)
    k_rope = torch.randn(kv_len, 64, device=dev, dtype=torch.bfloat16)
    v = torch.randn(kv_len, heads, 128, device=dev, dtype=torch.bfloat16)
    cu_q = torch.tensor([0, q_len], device=dev, dtype=torch.int32)
    cu_k = torch.tensor([0, kv_len], device=dev, dtype=torch.int32)
    out = torch.empty(q_len, heads, 128, device=dev, dtype=torch.bfloat16)
    us = _time_us(lambda: mla_prefill(q_nope, q_rope, k_nope, k_rope, v, cu_q, cu_k, q_len, SCALE, out=out,
                                      tile=tile))
    prefix = kv_len - q_len
    pairs = q_len * prefix + q_len * (q_len + 1) / 2
    flops = 2 * heads * pairs * (192 + 128)  # causal: only the visible pairs
    t = tile
    return {"q_len": q_len, "kv_len": kv_len, "heads": heads, "us": round(us, 1),
            "tflops": round(flops / (us * 1e-6) / 1e12, 1), "frac_of_810": round(flops / (us * 1e-6) / BF16_FLOPS, 3),
            "tile": None if t is None else f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}"}


def decode_points():
    """(tag, kind, batch, heads, q_len, ctx, fold) in priority order."""
    pts = []
    for b in (4, 8, 16):  # the seeds' decode case
        for kind in ("fp8", "bf16"):
            pts.append(("seeds", kind, b, 16, 4, 81920, None))
    for b, ctx in ((1, 16384), (4, 16384), (16, 16384), (4, 81920), (16, 81920)):  # fold vs no fold
        for kind in ("bf16", "fp8"):
            pts.append(("fold_on", kind, b, 16, 4, ctx, True))
            pts.append(("fold_off", kind, b, 16, 4, ctx, False))
    grid = []
    for kind in ("bf16", "fp8"):
        for ctx in (16384, 81920, 4096):
            for b in (16, 64, 128, 1, 4, 8):
                for h in (16, 32, 64, 128):
                    for ql in (1, 2, 4, 8):
                        grid.append(("sweep", kind, b, h, ql, ctx, None))
    # Memory-bound target shapes first (ctx >= 8K, batch >= 16), then the rest.
    grid.sort(key=lambda p: (not (p[5] >= 8192 and p[2] >= 16), p[5] == 4096, p[4], p[3]))
    return pts + grid


def small_points():
    """The seeds' case, then a 16-point grid (for a short run beside another kernel)."""
    pts = [p for p in decode_points() if p[0] == "seeds"]
    for kind in ("bf16", "fp8"):
        for b, h, ql, ctx in ((16, 16, 1, 16384), (16, 16, 1, 81920), (16, 16, 4, 16384), (1, 16, 4, 81920),
                              (16, 128, 1, 16384), (4, 128, 1, 81920), (16, 32, 2, 81920), (16, 64, 1, 81920)):
            pts.append(("small", kind, b, h, ql, ctx, None))
    return pts


def select_points(which: str):
    if which == "seeds":
        return [p for p in decode_points() if p[0] == "seeds"]
    if which == "small":
        return small_points()
    return decode_points()


def candidate_impls(names: str | None) -> dict:
    """{name: impl} of the named `mla/decode` kernels for this GPU, or {name: "why not"}."""
    if not names:
        return {}
    import lightspeed_kernel as lk

    platform = lk.platform_of(torch.device("cuda"))
    found = {}
    for name in (n.strip() for n in names.split(",") if n.strip()):
        try:
            chosen = lk.select_kernel("mla", "decode", torch.bfloat16, platform=platform, override=name,
                                      traits={"page_size": 64})
            found[name] = chosen.impl
            kinds = chosen.spec.traits.get("kv_dtype")
            if kinds is not None:  # the cache kinds it is registered for: other points get a "not for" row
                found[name] = _KindLimited(chosen.impl, tuple(kinds) if not isinstance(kinds, str) else (kinds,))
        except Exception as e:  # noqa: BLE001 - not registered here: say so in the table
            found[name] = f"{type(e).__name__}: {e}"[:200]
    return found


class _KindLimited:
    """A candidate registered for some cache kinds only (`kv_dtype` trait)."""

    def __init__(self, impl, kinds: tuple):
        self.impl, self.kinds = impl, kinds
        self.plan, self.run = impl.plan, impl.run
        if hasattr(impl, "bind"):
            self.bind = impl.bind


def run_candidates(bench, candidates: dict, tag, kind, b, h, ql, ctx, fold) -> list[dict]:
    """One row per candidate on one point (same seed: same pages and queries), err vs the first one's."""
    rows, first = [], None
    for name, impl in candidates.items():
        if isinstance(impl, str):
            r = {"kind": kind, "batch": b, "heads": h, "q_len": ql, "ctx": ctx, "error": impl}
        elif isinstance(impl, _KindLimited) and kind not in impl.kinds:
            continue  # registered for other caches (e.g. the FP8-only variant on a bf16 point)
        elif not hasattr(impl, "plan"):
            r = {"kind": kind, "batch": b, "heads": h, "q_len": ql, "ctx": ctx, "error": "no plan / run"}
        else:
            try:
                r = bench.run(kind, b, h, ql, ctx, fold=fold, impl=impl, seed=1000 + b + h + ql + ctx)
                if first is None:
                    first = bench.last_out.clone()
                    r["err_vs_first"] = 0.0
                else:
                    r["err_vs_first"] = round(rel_err(bench.last_out, first), 5)
            except Exception as e:  # noqa: BLE001 - a kernel that refuses a point (fp8 on sm90) is a result
                r = {"kind": kind, "batch": b, "heads": h, "q_len": ql, "ctx": ctx,
                     "error": f"{type(e).__name__}: {e}"[:200]}
        r["kernel"], r["tag"] = name, tag
        rows.append(r)
    return rows


def tile_sweep(bench, results):
    from lightspeed_mla.tuning import DecodeTile

    # Run 1 (tools/bench/mla.py --tile-sweep at commit 18794ba) timed 5 tiles per class; these are
    # the survivors and one neighbour each, re-timed under the one-wave split policy.
    small = {"bf16": [DecodeTile(16, 32, 4, 3, True, 2), DecodeTile(16, 32, 4, 4, True, 2),
                      DecodeTile(16, 64, 4, 3, True, 2)],
             "fp8": [DecodeTile(16, 32, 4, 2, True, 2), DecodeTile(16, 32, 4, 3, True, 2),
                     DecodeTile(16, 32, 8, 2, False, 1)]}
    big = {"bf16": [DecodeTile(64, 64, 8, 2, True, 1), DecodeTile(64, 32, 8, 2, False, 1)],
           "fp8": [DecodeTile(64, 32, 8, 2, False, 1), DecodeTile(64, 16, 8, 3, False, 1)]}
    for kind in ("bf16", "fp8"):
        for tiles, (b, h, ql, ctx, fold) in ((small[kind], (16, 16, 1, 16384, None)),
                                             (big[kind], (16, 16, 4, 16384, True))):
            for t in tiles:
                try:
                    r = bench.run(kind, b, h, ql, ctx, fold=fold, tile=t)
                except Exception as e:  # noqa: BLE001 - a tile that fails to compile is a result too
                    r = {"kind": kind, "batch": b, "heads": h, "q_len": ql, "ctx": ctx, "tile": str(t),
                         "error": f"{type(e).__name__}: {str(e)[:160]}"}
                results["tile_sweep"].append(r)
                print("tile", r, flush=True)


def save(results: dict, out: Path) -> None:
    """Write what there is so far (a run stopped at its time limit still leaves its numbers)."""
    results["fold_speedup"] = []
    on = {(r["kind"], r["batch"], r["ctx"]): r for r in results["decode"] if r["tag"] == "fold_on" and "us" in r}
    for r in results["decode"]:
        key = (r["kind"], r["batch"], r["ctx"])
        if r["tag"] == "fold_off" and "us" in r and key in on:
            results["fold_speedup"].append({"kind": key[0], "batch": key[1], "ctx": key[2], "fold_us": on[key]["us"],
                                            "nofold_us": r["us"], "speedup": round(r["us"] / on[key]["us"], 2)})
    stem = results.setdefault("_stem", str(result_stem(out, "mla_bench", results.get("device"))))
    Path(stem + ".json").write_text(json.dumps({k: v for k, v in results.items() if k != "_stem"}, indent=1))
    write_markdown(results, Path(stem + ".md"))


def write_markdown(results: dict, path: Path) -> None:
    lines = [f"# MLA kernels on {results['device']}", "",
             f"commit {results['commit']}, {results['date']}, torch {results['torch']}, triton {results['triton']}", "",
             f"Ceilings measured in this run: {results['ceilings']}. Fractions below use the nominal "
             f"4.27 TB/s and 810 TFLOP/s (bf16; FP8 caches: 1620). HBM frac counts only the bytes a perfect "
             f"kernel moves; of roofline = max(bytes / 4.27 TB/s, FLOPs / MMA peak) / µs.", "", "## Prefill (non-absorbed, causal, 128 heads, qk 192 / v 128)", "",
             "| q | kv | µs | TFLOP/s | of 810 | tile |", "|---|---|---|---|---|---|"]
    for r in results["prefill"]:
        lines.append(f"| {r['q_len']} | {r['kv_len']} | {r['us']} | {r['tflops']} | {r['frac_of_810']} | {r['tile']} |")
    lines += ["", "## Fold vs no fold (16 heads, q_len 4)", "", "| kind | batch | ctx | fold µs | no-fold µs | speed-up |",
              "|---|---|---|---|---|---|"]
    for r in results["fold_speedup"]:
        lines.append(f"| {r['kind']} | {r['batch']} | {r['ctx']} | {r['fold_us']} | {r['nofold_us']} | {r['speedup']} |")
    fi = results.get("flashinfer")
    lines += ["", "## Decode (absorbed, page 64)", ""] + _flashinfer_note(fi) + [
              "| tag | kv | batch | heads | q_len | ctx | µs | roofline µs | of roofline | HBM frac | TFLOP/s | bound | "
              "fold | splits | tile |" + (" FlashInfer µs | FI of roofline | ours µs / FI µs | FI err |" if fi else ""),
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|---|" if fi else "")]
    if any("kernel" in r for r in results["decode"]):
        lines += _candidates_table(results["decode"])
    for r in results["decode"]:
        if "kernel" in r:
            continue
        if "error" in r:
            lines.append(f"| {r['tag']} | {r['kind']} | {r['batch']} | {r['heads']} | {r['q_len']} | {r['ctx']} | "
                         f"error: {r['error']} |")
            continue
        lines.append(f"| {r['tag']} | {r['kind']} | {r['batch']} | {r['heads']} | {r['q_len']} | {r['ctx']} | "
                     f"{r['us']} | {r['roofline_us']} | {r['of_roofline']} | {r['hbm_frac']} | {r['tflops']} | "
                     f"{r['bound']} | {r['fold']} | {r['splits']} | "
                     f"{r['tile']} |" + (_flashinfer_cells(r, fi) if fi else ""))
    if results["skipped"]:
        lines += ["", f"Not run (budget): {len(results['skipped'])} sweep points, e.g. {results['skipped'][:6]}"]
    if results["tile_sweep"]:
        lines += ["", "## Tile sweep", "", "```"] + [json.dumps(r) for r in results["tile_sweep"]] + ["```"]
    path.write_text("\n".join(lines) + "\n")


def _candidates_table(rows: list[dict]) -> list[str]:
    out = ["### Candidates (--candidates): one row per kernel and point; err vs the first candidate", "",
           "| kernel | tag | kv | batch | heads | q_len | ctx | µs | roofline µs | of roofline | HBM frac | "
           "TFLOP/s | splits | err |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "kernel" not in r:
            continue
        head = f"| {r['kernel']} | {r['tag']} | {r['kind']} | {r['batch']} | {r['heads']} | {r['q_len']} | {r['ctx']} |"
        if "error" in r:
            out.append(head + f" error: {r['error']} |")
        else:
            out.append(head + f" {r['us']} | {r['roofline_us']} | {r['of_roofline']} | {r['hbm_frac']} | "
                              f"{r['tflops']} | {r['splits']} | {r.get('err_vs_first', '')} |")
    return out + [""]


def _flashinfer_note(info: dict | None) -> list[str]:
    if not info:
        return []
    if "why" in info:
        return [f"FlashInfer: not measured here ({info['why']}).", ""]
    return [f"FlashInfer {info['version']} MLA decode (backend {info['backend']}) on the same queries and pages, "
            "timed the same way; its err is against our output. FP8 rows run FlashInfer's own FP8 format "
            "(a copy of our cache: e4m3 rope with one scale, 592 B a token against our 644), judged against "
            "our format's roofline: compare the µs.", ""]


def _flashinfer_cells(r: dict, info: dict) -> str:
    if "why" in info:
        return " n/a (above) | | | |"
    if "fi_error" in r:
        return f" error: {r['fi_error']} | | | |"
    if "fi_us" not in r:
        return " — | | | |"  # not measured on this point (fold off: a knob of ours)
    eager = "" if r.get("fi_graph", True) else " (eager)"
    return f" {r['fi_us']}{eager} | {r['fi_of_roofline']} | {r['fi_speedup']} | {r['fi_err']} |"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop starting new sweep points after this")
    ap.add_argument("--tile-sweep", action="store_true", help="also time alternative tiles (tuning)")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--commit", default=None, help="git commit to record (the device copy has no .git)")
    ap.add_argument("--flashinfer", action="store_true",
                    help="also time FlashInfer's MLA decode on each point (on the H200: source "
                         "tools/bench/h200/flashinfer_setup.sh, then mla/scripts/flashinfer_mla_sources.sh install)")
    ap.add_argument("--flashinfer-backend", choices=("fa3", "fa2"), default=None,
                    help="FlashInfer's MLA backend (default: fa3 on sm_90, else fa2)")
    ap.add_argument("--candidates", default=None,
                    help="comma-separated mla/decode kernel names to time side by side on each decode point "
                         "(e.g. mla_decode_triton,mla_decode_sm90)")
    ap.add_argument("--points", choices=("all", "small", "seeds"), default="all", help="which decode points")
    args = ap.parse_args(argv)
    import triton

    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(), "commit": args.commit or _git_commit(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
               "triton": triton.__version__, "ceilings": measure_ceilings(), "prefill": [], "decode": [],
               "fold_speedup": [], "skipped": [], "tile_sweep": []}
    print("ceilings", results["ceilings"], flush=True)
    flashinfer = FlashInferColumn(backend=args.flashinfer_backend) if args.flashinfer else None
    results["flashinfer"] = flashinfer.info if flashinfer else None
    if flashinfer:
        print("flashinfer", flashinfer.info, flush=True)
    bench = DecodeBench(max_tokens=(128 if args.points == "all" else 16) * 81920 + 4096)
    if args.tile_sweep:
        tile_sweep(bench, results)
        save(results, args.out)
    if not args.skip_prefill:
        results["prefill"].append(prefill_point())
        print("prefill", results["prefill"][-1], flush=True)
    candidates = candidate_impls(args.candidates)
    results["candidates"] = {k: (v if isinstance(v, str) else "ok") for k, v in candidates.items()}
    for tag, kind, b, h, ql, ctx, fold in select_points(args.points):
        if time.time() - t0 > args.budget_s:
            results["skipped"].append([kind, b, h, ql, ctx])
            continue
        if candidates:
            if fold is False:
                continue  # a knob of the Triton planner
            for r in run_candidates(bench, candidates, tag, kind, b, h, ql, ctx, fold):
                results["decode"].append(r)
                print(json.dumps(r), flush=True)
            save(results, args.out)
            continue
        try:
            r = bench.run(kind, b, h, ql, ctx, fold=fold, flashinfer=flashinfer if tag != "fold_off" else None)
        except Exception as e:  # noqa: BLE001 - record and go on
            r = {"kind": kind, "batch": b, "heads": h, "q_len": ql, "ctx": ctx, "error": f"{type(e).__name__}: {e}"[:200]}
        r["tag"] = tag
        results["decode"].append(r)
        print(json.dumps(r), flush=True)
        if len(results["decode"]) % 10 == 0:
            save(results, args.out)
    save(results, args.out)
    print(f"done in {time.time() - t0:.0f}s; {len(results['decode'])} decode points, {len(results['skipped'])} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
