"""Compile every Triton kernel of lightspeed_kernel.triton for sm_90 on a machine without a GPU.

Compiled Triton is stricter than the interpreter the CPU tests run (loop-carried types, scalar
conditions, shared-memory budgets), so this drives each public launcher with CPU tensors while a
stand-in driver reports an sm_90 target and every launch is turned into a compile-only warm-up.
Run: `python kernel/tests/triton/sm90_compile_check.py [name substrings]` (TRITON_INTERPRET unset); exits 1 on a
failure and prints each kernel's shared memory, register count and spill bytes.
"""

# ruff: noqa: B023  (each yielded case runs before the generator advances, so late binding is harmless)
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton.backends.nvidia  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _Sm90StandIn:
    """The subset of a Triton driver that JITFunction.run reads before launching."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


COMPILED: list = []
_run = JITFunction.run
_CUOBJDUMP = Path(triton.backends.nvidia.__file__).with_name("bin") / "cuobjdump"


def _resources(kernel) -> str:
    """Registers and spill bytes of the compiled cubin (the stand-in driver never loads it, so the
    kernel's own n_regs is unset): `cuobjdump -res-usage`, Triton's bundled copy."""
    if not _CUOBJDUMP.exists():
        return "regs ?"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(_CUOBJDUMP), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    return f"regs {found[1]:>3}  spill {int(found[2]) + int(found[3])} B" if found else "regs ?"


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    COMPILED.append((self.fn.__name__, kernel))
    return kernel


def _packed_prefill_tiles():
    from lightspeed_kernel.triton.attention_prefill import PrefillTiles

    return [PrefillTiles(128, 64, 4, 3, True), PrefillTiles(128, 128, 8, 3, True), PrefillTiles(64, 64, 4, 3, True),
            PrefillTiles(256, 64, 8, 3, True),
            # the warp-specialised mask-free loop of the H200 sweep (tools/bench/prefill_attention.py)
            PrefillTiles(128, 128, 8, 2, False, True), PrefillTiles(128, 128, 8, 3, False, True),
            PrefillTiles(128, 64, 8, 2, False, True), PrefillTiles(128, 64, 8, 3, False, True)]


def _gemv_cases():
    """The skinny GEMM's pick for each Llama-3.1-8B decode shape, and its sweep's largest tiles."""
    from lightspeed_kernel.triton import gemv

    shapes = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096))
    weights = {nk: torch.empty(nk, dtype=torch.bfloat16) for nk in shapes}  # never touched: compile only
    for m in (1, 2, 4, 8, 16):
        configs = {gemv.choose_config(m, n, k, 132): (n, k) for n, k in shapes}
        space = gemv.sweep_configs(m, 4096, 4096, 132)
        for path in (False, True):  # the largest shared-memory and per-thread tiles of each path
            mine = [c for c in space if c.use_dot == path]
            for key in (lambda c: c.smem_bytes(m), lambda c: c.block_n * c.block_k / c.num_warps):
                if mine:
                    configs.setdefault(max(mine, key=key), (4096, 4096))
        for cfg, (n, k) in configs.items():
            x, w = torch.empty(m, k, dtype=torch.bfloat16), weights[n, k]
            yield (f"gemv m{m} {n}x{k} {tuple(vars(cfg).values())}",
                   lambda x=x, w=w, cfg=cfg: gemv.launch(x, w, w[0], cfg))


def _norm_gemv_cases():
    """The norm folded into the one-row GEMM, on the Llama-3.1-8B projections that follow a norm."""
    from lightspeed_kernel.triton import norm_gemv

    x = torch.empty(1, 4096, dtype=torch.bfloat16)
    for n in (6144, 28672, 128256):
        w = torch.empty(n, 4096, dtype=torch.bfloat16)
        for residual in (None, x.clone()):
            yield (f"norm_gemv {n} residual={residual is not None}",
                   lambda w=w, r=residual: norm_gemv.launch(x, r, x[0], 1e-5, w))


def _act_gemv_cases():
    """SiLU-and-mul folded into the one-row down projection, the Llama-3.1-8B shape."""
    from lightspeed_kernel.triton import act_gemv

    x, w = torch.empty(1, 2 * 14336, dtype=torch.bfloat16), torch.empty(4096, 14336, dtype=torch.bfloat16)
    yield "act_gemv 4096x14336", lambda: act_gemv.launch(x, w)


def cases():
    from lightspeed_kernel.reference import moe as ref_moe
    from lightspeed_kernel.triton import (
        activation,
        attention_decode,
        attention_prefill,
        fp8_gemm,
        fused_moe,
        kv_store,
        moe_topk,
        norm,
        quantize,
        rope,
        sampling,
        spec,
    )

    PACKED_PREFILL_TILES = _packed_prefill_tiles()
    bf, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    e4m3 = torch.float8_e4m3fn
    for dt in (bf, f16, f32):
        x = torch.randn(8, 4096, dtype=dt)
        yield "rms_norm", lambda x=x: norm.rms_norm(x, x[0], 1e-6)
        yield "fused_add_rms_norm", lambda x=x: norm.fused_add_rms_norm(x, x.clone(), x[0], 1e-6)
        yield "silu_and_mul", lambda x=x: activation.silu_and_mul(x)
        yield "gelu_and_mul", lambda x=x: activation.gelu_and_mul(x, "tanh")
        q, k = torch.randn(4, 32, 128, dtype=dt), torch.randn(4, 8, 128, dtype=dt)
        cache = torch.randn(64, 128)
        pos = torch.zeros(4, dtype=torch.int64)
        yield "rope neox", lambda q=q, k=k: rope.apply_rope(pos, q, k, cache)
        yield "rope gptj partial", lambda q=q, k=k: rope.apply_rope(pos, q, k, cache[:, :64], is_neox=False)
        yield "quant per token", lambda x=x: quantize.quant_fp8_per_token(x)
        yield "quant per block", lambda x=x: quantize.quant_fp8_per_block(x)
        yield "quant per token head", lambda q=q: quantize.quant_fp8_per_token_head(q)
        for cache_dt in (dt, e4m3):
            for ps in (16, 64):
                kc = torch.zeros(10, ps, 8, 128, dtype=cache_dt)
                slots = torch.arange(4, dtype=torch.int64)
                scale = {} if cache_dt == dt else {"k_scale": 0.5, "v_scale": 0.5}
                yield (
                    f"store_kv {cache_dt} ps{ps}",
                    lambda kc=kc, k=k, scale=scale: kv_store.store_kv(k, k, kc, kc.clone(), slots, **scale),
                )
                yield (
                    f"rope_store_kv {cache_dt} ps{ps}",
                    lambda kc=kc, q=q, k=k, scale=scale: kv_store.rope_store_kv(
                        pos, q, k, k, cache, kc, kc.clone(), slots, **scale
                    ),
                )
                pt = torch.ones(4, 3, dtype=torch.int32)
                qsl = torch.arange(5, dtype=torch.int32)
                sl = torch.full((4,), 20, dtype=torch.int32)
                for cap in (None, 30.0):
                    kw = {"max_query_len": 1, "scale": 0.08, "soft_cap": cap, **scale}
                    yield (
                        f"decode {dt} {cache_dt} ps{ps} cap{cap}",
                        lambda kc=kc, q=q, pt=pt, kw=kw: attention_decode.attention_decode(
                            q, kc, kc, pt, qsl, sl, **kw
                        ),
                    )
                    plan = attention_decode.plan_decode(4, 32, 8, 128, ps, 3, 1, num_splits=3)
                    yield (
                        f"decode split {dt} ps{ps}",
                        lambda kc=kc, q=q, pt=pt, kw=kw, plan=plan: attention_decode.run_decode(
                            plan, q, kc, kc, pt, qsl, sl, scale=0.08
                        ),
                    )
                    yield (
                        f"prefill {dt} {cache_dt} ps{ps} cap{cap}",
                        lambda kc=kc, q=q, pt=pt, kw=kw: attention_prefill.attention_prefill(
                            q, kc, kc, pt, qsl, sl, **kw
                        ),
                    )
        if dt == bf:  # every prefill launch shape the chooser or the H200 sweep may use
            for t in (attention_prefill.prefill_tiles(128, 8192, bf), attention_prefill.prefill_tiles(128, 800, bf),
                      *PACKED_PREFILL_TILES):
                for cache_dt in (bf, e4m3):
                    kc = torch.zeros(10, 16, 8, 128, dtype=cache_dt)
                    scale = {} if cache_dt == bf else {"k_scale": 0.5, "v_scale": 0.5}
                    yield (
                        f"prefill tiles {tuple(vars(t).values())} {cache_dt}",
                        lambda kc=kc, q=q, t=t, scale=scale: attention_prefill.launch_prefill(
                            q, kc, kc, torch.ones(4, 3, dtype=torch.int32), torch.arange(5, dtype=torch.int32),
                            torch.full((4,), 20, dtype=torch.int32), torch.empty_like(q), 4, 32, 8, 128,
                            max_query_len=1, scale=0.08, soft_cap=None, k_scale=scale.get("k_scale"),
                            v_scale=scale.get("v_scale"), tiles=t),
                    )
        qmulti = torch.randn(16, 32, 128, dtype=dt)
        qsl4 = torch.tensor([0, 4, 8, 12, 16], dtype=torch.int32)
        kc = torch.zeros(10, 16, 8, 128, dtype=dt)
        yield (
            "decode 4 query tokens",
            lambda kc=kc, q=qmulti: attention_decode.attention_decode(
                q,
                kc,
                kc,
                torch.ones(4, 3, dtype=torch.int32),
                qsl4,
                torch.full((4,), 20, dtype=torch.int32),
                max_query_len=4,
                scale=0.1,
            ),
        )
        logits = torch.randn(8, 128, dtype=dt)
        yield "moe topk softmax", lambda lg=logits: moe_topk.moe_topk(lg, 8)
        yield (
            "moe topk grouped",
            lambda lg=logits: moe_topk.moe_topk(
                lg, 8, scoring="sigmoid", correction_bias=torch.zeros(128), num_groups=8, topk_groups=4
            ),
        )
        if True:
            hid, inter = (2048, 768) if dt != f32 else (256, 128)  # fp32: small, the IEEE-dot path
            xm = torch.randn(n := 64, hid, dtype=dt)
            w13, w2 = torch.randn(128, 2 * inter, hid, dtype=dt), torch.randn(128, hid, inter, dtype=dt)
            w, ids = ref_moe.moe_topk(torch.randn(n, 128), 8)
            yield "fused experts", lambda: fused_moe.fused_experts(xm, w13, w2, w, ids)
            yield "fused experts decode", lambda: fused_moe.fused_experts(xm[:1], w13, w2, w[:1], ids[:1])
    for m in (8, 512):
        a = torch.zeros(m, 1024, dtype=e4m3)
        b = torch.zeros(2048, 1024, dtype=e4m3)
        yield (
            f"fp8 gemm m{m}",
            lambda a=a, b=b, m=m: fp8_gemm.fp8_block_gemm(a, torch.ones(m, 8), b, torch.ones(16, 8)),
        )
    yield from _gemv_cases()
    yield from _norm_gemv_cases()
    yield from _act_gemv_cases()
    lg = torch.randn(4, 1000)
    one = torch.ones(4)
    yield (
        "penalties",
        lambda: sampling.apply_penalties(
            lg, torch.zeros(4, 1000, dtype=torch.int32), torch.zeros(4, 1000, dtype=torch.bool), one, one, one
        ),
    )
    yield (
        "sample",
        lambda: sampling.sample(
            lg,
            one,
            torch.full((4,), 5, dtype=torch.int32),
            0.9 * one,
            0 * one,
            torch.arange(4),
            torch.arange(4),
        ),
    )
    yield "logprobs", lambda: sampling.compute_logprobs(lg, torch.zeros(4, dtype=torch.int64), 5)
    yield "greedy", lambda: sampling.greedy(torch.zeros(4, 9000))
    history = torch.zeros(8, 4096, dtype=torch.int32)
    yield (
        "ngram lookup",
        lambda: spec.ngram_lookup(history, torch.arange(4), torch.full((8,), 100), k=4, n_min=3, n_max=8,
                                  max_len=4096),
    )
    qsl = torch.tensor([0, 5, 10, 11], dtype=torch.int32)
    ids = torch.zeros(12, dtype=torch.int64)
    yield "spec verify", lambda: spec.spec_verify(ids[:11], ids, qsl, num_decodes=2, max_query_len=5,
                                                  chain_ok=torch.ones(2, dtype=torch.bool),
                                                  matched=torch.zeros(8, dtype=torch.int32), sample_slots=ids)
    yield "spec shift rows", lambda: spec.spec_shift_rows(
        ids[:11], ids, torch.full((3,), 20, dtype=torch.int32), torch.zeros(3, 4, dtype=torch.int32), qsl,
        torch.ones(11, dtype=torch.bool), ids[:11], ids, ids, page_size=16, max_query_len=5)
    yield "spec ngram record", lambda: spec.ngram_record(
        history, torch.zeros(8, dtype=torch.int64), ids[:11], ids, ids[:11], ids[:11], qsl, num_decodes=2,
        num_decode_tokens=10, max_query_len=5, keep=torch.ones(11, dtype=torch.bool))
    yield "spec fill drafts", lambda: spec.spec_fill_drafts(ids, qsl, torch.zeros(8, 4, dtype=torch.int64), ids,
                                                            num_decodes=2, max_query_len=5)


# The launchers whose kernels start with pdl_enter (programmatic dependent launch on sm_90+): a second
# pass compiles their cases with PDL on, as an H200 launches them, and checks the wait is in the PTX.
PDL_MODULES = ("act_gemv", "activation", "attention_decode", "gemv", "kv_store", "norm", "norm_gemv", "rope")
PDL_CASES = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "gelu_and_mul", "rope", "store_kv", "decode", "gemv ",
             "norm_gemv", "act_gemv")


def _force_pdl() -> None:
    import importlib

    for name in PDL_MODULES:
        module = importlib.import_module(f"lightspeed_kernel.triton.{name}")
        module.pdl_args = lambda device: {"USE_PDL": True, "launch_pdl": True}


def _compile_cases(argv: list[str], label: str, pdl: bool) -> int:
    failures = 0
    for name, fn in cases():
        if argv and not any(a in name for a in argv):
            continue
        if pdl and not name.startswith(PDL_CASES):
            continue
        before = len(COMPILED)
        try:
            fn()
        except Exception:
            failures += 1
            print(f"FAIL {label}{name}\n{traceback.format_exc(limit=3)}", flush=True)
            continue
        for kname, kernel in COMPILED[before:]:
            md = kernel.metadata
            ptx = kernel.asm["ptx"]
            if pdl and "griddepcontrol.wait" not in ptx:
                failures += 1
                print(f"FAIL {label}{name}: {kname} has no griddepcontrol.wait", flush=True)
            elif pdl and kname in ("_skinny_gemm_kernel", "_rms_norm_gemv_kernel", "_silu_mul_gemv_kernel") and "ld.global" not in ptx[: ptx.index("griddepcontrol.wait")]:
                failures += 1  # the first weight tile is meant to stream in before the wait
                print(f"FAIL {label}{name}: no weight load before griddepcontrol.wait", flush=True)
            print(f"ok   {label}{name:40s} {kname:28s} smem {md.shared:6d} B  {_resources(kernel)}", flush=True)
    return failures


def main(argv: list[str]) -> int:
    """argv: optional substrings; only cases whose name contains one of them are compiled."""
    driver.set_active(_Sm90StandIn())
    JITFunction.run = _compile_only
    failures = _compile_cases(argv, "", pdl=False)
    _force_pdl()
    failures += _compile_cases(argv, "pdl ", pdl=True)
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
