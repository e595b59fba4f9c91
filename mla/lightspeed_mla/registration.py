"""Entry point ``lightspeed_kernel.plugins: mla``: registers family "mla", modes "decode" and "prefill".

Triton kernels go in the PLUGIN band (NVIDIA, compute capability >= 8.0: bf16 MMA); the torch
references go in the REFERENCE band and run anywhere, so the CPU still gets a kernel. The impls
are callables with the one-shot signatures of :func:`mla_decode` / :func:`mla_prefill`; the
decode impl also carries ``plan`` / ``run`` (the CUDA-graph path) and ``workspace_bytes``.
"""

from __future__ import annotations

import torch

from .decode import decode_workspace_bytes, mla_decode, plan_decode, run_decode
from .prefill import mla_prefill
from .reference import mla_decode_reference, mla_prefill_reference

PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_FEATURES = ("paged", "bf16_kv", "fp8_kv", "lse", "spec_decode", "causal", "fold_sq", "split_kv", "ragged")
PREFILL_FEATURES = ("ragged", "causal", "prefix", "lse", "shared_rope")
KERNEL_NAMES = {
    "decode": ("mla_decode_triton", "mla_decode_reference"),
    "prefill": ("mla_prefill_triton", "mla_prefill_reference"),
}


class _DecodeOp:
    """mla_decode as a registry impl, with the plan/run API attached."""

    plan = staticmethod(plan_decode)
    run = staticmethod(run_decode)
    workspace_bytes = staticmethod(decode_workspace_bytes)

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
    entries = [
        ("decode", "mla_decode_triton", "triton", lk.Priority.PLUGIN, triton_cap, DECODE_FEATURES,
         {"page_size": PAGE_SIZES, "kv_dtype": ("bf16", "fp8")}, ("latency", "throughput"), _DecodeOp()),
        ("decode", "mla_decode_reference", "reference", lk.Priority.REFERENCE, None, DECODE_FEATURES,
         {"page_size": PAGE_SIZES, "kv_dtype": ("bf16", "fp8")}, (), _decode_reference),
        ("prefill", "mla_prefill_triton", "triton", lk.Priority.PLUGIN, triton_cap, PREFILL_FEATURES,
         {"head_dim_qk": (192,), "head_dim_v": (128,)}, ("throughput",), mla_prefill),
        ("prefill", "mla_prefill_reference", "reference", lk.Priority.REFERENCE, None, PREFILL_FEATURES,
         {"head_dim_qk": (192,), "head_dim_v": (128,)}, (), _prefill_reference),
    ]
    for mode, name, solution, priority, cap, features, traits, tags, impl in entries:
        if (mode, name) in have:
            continue
        lk.register_kernel("mla", mode, name=name, solution=solution, priority=priority, capability=cap,
                           dtypes=[torch.bfloat16], features=features, traits=traits, tags=tags,
                           registry=reg)(impl)
