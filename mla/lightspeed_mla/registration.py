"""Entry point ``lightspeed_kernel.plugins: mla``: registers family "mla", modes "decode",
"prefill" and "store".

Triton kernels go in the PLUGIN band (NVIDIA, compute capability >= 8.0: bf16 MMA, bf16 inputs);
the torch references go in the REFERENCE band and run anywhere, in fp32 / fp16 / bf16, so the CPU
still gets a kernel (and fp32 parity tests get fp32 math). The impls are callables with the
one-shot signatures of :func:`mla_decode` / :func:`mla_prefill` / :func:`pack_kv`; the decode
impl also carries ``plan`` / ``bind`` / ``run`` (the CUDA-graph path) and ``workspace_bytes``.
On sm_90 two more decode kernels rank above Triton: FlashInfer's MLA decode (``flashinfer_mla.py``,
``flashinfer_graph.py``) at PLUGIN + 2 for bf16 caches when the package is installed (nothing
registers and nothing fails without it), and the sm_90a CUDA kernel ``mla_decode_sm90`` (``sm90.py``)
at PLUGIN + 1 for bf16 and FP8 caches when torch has CUDA and nvcc is found (it JIT-builds before the
engine's first step; a failed build falls back to the next kernel). Its e4m3-scores FP8 variant
``mla_decode_sm90_fp8qk`` and its all-e4m3 variant ``mla_decode_sm90_fp8mma`` are in the PORTABLE band:
opt-in.
"""

from __future__ import annotations

import dataclasses

import torch

from . import flashinfer_mla, sm90
from .cache import pack_kv, pack_kv_reference
from .decode import decode_workspace_bytes, mla_decode, plan_decode, run_decode
from .prefill import mla_prefill
from .reference import mla_decode_reference, mla_prefill_reference

PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_FEATURES = ("paged", "bf16_kv", "fp8_kv", "lse", "spec_decode", "causal", "fold_sq", "split_kv", "ragged")
PREFILL_FEATURES = ("ragged", "causal", "prefix", "lse", "shared_rope")
STORE_FEATURES = ("paged", "bf16_kv", "fp8_kv")
KERNEL_NAMES = {
    "decode": ("mla_decode_triton", "mla_decode_reference"),
    "prefill": ("mla_prefill_triton", "mla_prefill_reference"),
    "store": ("mla_store_triton", "mla_store_reference"),
}
REFERENCE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _DecodeOp:
    """mla_decode as a registry impl, with the plan / bind / run API attached (the engine's contract:
    `plan(workspace, query_start_loc, seq_lens, num_heads, *, page_size, softmax_scale, cache_kind,
    captured=False)` from bounding lengths, `bind(plan, query_start_loc, seq_lens, page_table)` onto a
    step's device metadata, `run(plan, q, cache, page_table, out, lse=None)` per layer). Triton's plans
    read the lengths on the device, so `captured` changes nothing and they have no `replan`."""

    run = staticmethod(run_decode)
    workspace_bytes = staticmethod(decode_workspace_bytes)

    @staticmethod
    def plan(workspace, query_start_loc, seq_lens, num_heads, *, captured: bool = False, **kwargs):
        return plan_decode(workspace, query_start_loc, seq_lens, num_heads, **kwargs)

    @staticmethod
    def bind(plan, query_start_loc, seq_lens, page_table):
        return dataclasses.replace(plan, query_start_loc=query_start_loc, seq_lens=seq_lens)

    def __call__(self, *args, **kwargs):
        return mla_decode(*args, **kwargs)


def _decode_reference(q, cache, page_table, seq_lens, query_start_loc, softmax_scale, *, out=None, return_lse=False,
                      **_ignored):
    o, lse = mla_decode_reference(q, cache, page_table, seq_lens, query_start_loc, softmax_scale)
    if out is not None:
        out.copy_(o)
        o = out
    return (o, lse) if return_lse else o


def _prefill_reference(q_nope, q_rope, k_nope, k_rope, v, cu_seqlens_q, cu_seqlens_k, max_q_len, softmax_scale, *,
                       out=None, lse=None, **_ignored):
    o, l_ = mla_prefill_reference(q_nope, q_rope, k_nope, k_rope, v, cu_seqlens_q, cu_seqlens_k, softmax_scale)
    if lse is not None:
        lse.copy_(l_)
    if out is not None:
        out.copy_(o)
        return out
    return o


def register(registry=None) -> None:
    """Register the MLA kernels (idempotent: a second call changes nothing)."""
    import lightspeed_kernel as lk

    reg = registry if registry is not None else lk.REGISTRY
    have = {(s.mode, s.name) for s in reg.specs("mla")}
    triton_cap = {"device_types": ("cuda",), "vendors": ("nvidia",), "min_compute_capability": (8, 0)}
    bf16, ref = (torch.bfloat16,), REFERENCE_DTYPES
    page_traits = {"page_size": PAGE_SIZES, "kv_dtype": ("bf16", "fp8")}
    entries = [
        ("decode", "mla_decode_triton", "triton", lk.Priority.PLUGIN, triton_cap, bf16, DECODE_FEATURES,
         page_traits, ("latency", "throughput"), _DecodeOp()),
        ("decode", "mla_decode_reference", "reference", lk.Priority.REFERENCE, None, ref, DECODE_FEATURES,
         page_traits, (), _decode_reference),
        ("prefill", "mla_prefill_triton", "triton", lk.Priority.PLUGIN, triton_cap, bf16, PREFILL_FEATURES,
         {"head_dim_qk": (192,), "head_dim_v": (128,)}, ("throughput",), mla_prefill),
        # The reference takes any head dims (small models in tests): it declares no head-dim trait.
        ("prefill", "mla_prefill_reference", "reference", lk.Priority.REFERENCE, None, ref, PREFILL_FEATURES,
         {}, (), _prefill_reference),
        # Dispatch dtype of the store: the latent's. The Triton store writes bf16 caches (or fp8 ones
        # from bf16 latents); the reference also fills fp32 / fp16 unquantised caches.
        ("store", "mla_store_triton", "triton", lk.Priority.PLUGIN, triton_cap, bf16, STORE_FEATURES,
         page_traits, (), pack_kv),
        ("store", "mla_store_reference", "reference", lk.Priority.REFERENCE, None, ref, STORE_FEATURES,
         page_traits, (), pack_kv_reference),
    ]
    for mode, name, solution, priority, cap, dtypes, features, traits, tags, impl in entries:
        if (mode, name) in have:
            continue
        lk.register_kernel("mla", mode, name=name, solution=solution, priority=priority, capability=cap,
                           dtypes=list(dtypes), features=features, traits=traits, tags=tags,
                           registry=reg)(impl)
    if ("decode", flashinfer_mla.KERNEL_NAME) not in have:
        flashinfer_mla.discover(reg, page_sizes=PAGE_SIZES)
    if ("decode", sm90.KERNEL_NAME) not in have:
        sm90.discover(reg)
