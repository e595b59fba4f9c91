"""Paged prefill through torch's own fused attention (`attention/prefill`, `sdpa_split_prefill`).

Why: on the H200, torch's `scaled_dot_product_attention` with `is_causal=True` over contiguous K/V
runs at 525-598 TFLOP/s (4K-32K tokens) where our Triton paged kernel reaches 345-390 and FlashInfer's
FA3 454-569 (bench/results/prefill_attention_2026-12-01_181726_nvidia-h200.md, flashinfer_h200_2026-12-01_2221/).
But torch has no paged, bottom-right-causal form: over a cached prefix the masked call falls to
~340. So each request's attention is split where the two halves are each a shape torch runs fast:

    new tokens x cached prefix   a full rectangle, no mask
    new tokens x new tokens      a square, top-left causal (= bottom-right for a square)

and the halves are merged with their log-sum-exps: o = (o1 e^l1 + o2 e^l2) / (e^l1 + e^l2), in fp32.
The private aten ops that return the log-sum-exp are used (FlashAttention's on CUDA, or cuDNN's;
`_scaled_dot_product_flash_attention_for_cpu` on CPU, where the tests run).

GQA without copying K/V per query head: in the rectangle every query row of a KV head sees the same
keys, so the G query heads of a group become G x L rows of one "head" ([Hkv, 1, G*L, D] against
[Hkv, 1, P, D]); only the square (L keys, small next to the prefix) repeats its K/V per query head.
The lengths that slice requests come from the op's `host_lengths` (the engine passes its plan's):
no read-back. A caller without them pays one host read per step, cached by the identity of the
metadata tensors as the FlashInfer adapter does, so the other layers of the step read nothing.
Per request and layer: one gather of its pages, two attention calls, a handful of small ops.

Measured on the H200, it loses (bench/results/prefill_attention_2026-12-02_041355_nvidia-h200.md):
the flash backend at 0.71-0.81x our Triton kernel on the served shapes; cuDNN 1.03-1.40x faster warm
but 72-832 ms at the first call of each new shape. So it stays in the PORTABLE band for NVIDIA,
below the Triton kernel, and runs only when asked for (`LIGHTSPEED_KERNEL_OVERRIDE_ATTENTION_PREFILL=sdpa_split_prefill`);
`tools/bench/prefill_attention.py --sdpa-split` measures it. Handed to the next kernel in line:
fp8 caches, soft cap, scales, fp32, CUDA-graph capture (the host read), and any call the probe of
the backend at first use found unsupported.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from .attention_adapters import metadata_identity, next_attention_kernel
from .registry import Priority, register_kernel

KERNEL = "sdpa_split_prefill"
_LOG = logging.getLogger(__name__)
Q_DTYPES = (torch.float16, torch.bfloat16)
# LIGHTSPEED_SDPA_PREFILL_BACKEND: "flash" (default; no per-shape set-up) or "cudnn" (faster warm, but
# torch builds a cuDNN graph per new shape on the host, and serving brings new shapes nearly every step).
BACKEND_ENV = "LIGHTSPEED_SDPA_PREFILL_BACKEND"


def _attend(q, k, v, causal: bool, scale: float, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, Lq, D], k/v [B, H, Lk, D] -> (out [B, H, Lq, D] in q's dtype, lse [B, H, Lq] fp32)."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    elif backend == "cudnn":
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False,
                                                                     scale=scale)[:2]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
    b, h, lq = q.shape[:3]
    return out, lse.reshape(b, h, -1)[..., :lq].float()


def attend_request(q, keys, values, prefix: int, scale: float, backend: str = "flash") -> torch.Tensor:
    """One request: q [L, Hq, D] (its new tokens), keys/values [prefix + L, Hkv, D] (its whole
    context, contiguous) -> [L, Hq, D], bottom-right causal. The split and merge of the module note."""
    length, hq, d = q.shape
    hkv = keys.shape[1]
    group = hq // hkv
    # Every operand is made contiguous in [B, H, S, D]: the fused kernels' stride rules differ by
    # backend and version, and these copies are small next to the attention itself.
    qh = q.transpose(0, 1).unsqueeze(0).contiguous()  # [1, Hq, L, D]
    # the square: new tokens among themselves, K/V repeated per query head (L rows only)
    k_new = keys[prefix:].transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    v_new = values[prefix:].transpose(0, 1).repeat_interleave(group, dim=0).unsqueeze(0)
    out, lse = _attend(qh, k_new, v_new, True, scale, backend)
    if prefix == 0:
        return out[0].transpose(0, 1)
    # the rectangle: a KV head's G query heads stacked as G*L rows of one head
    q_rows = q.view(length, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, 1, group * length, d).contiguous()
    k_old = keys[:prefix].transpose(0, 1).unsqueeze(1).contiguous()  # [Hkv, 1, P, D]
    v_old = values[:prefix].transpose(0, 1).unsqueeze(1).contiguous()
    out_old, lse_old = _attend(q_rows, k_old, v_old, False, scale, backend)
    out_old = out_old.reshape(hkv, group, length, d).reshape(1, hq, length, d)
    lse_old = lse_old.reshape(1, hq, length)
    top = torch.maximum(lse, lse_old)
    w_new, w_old = torch.exp(lse - top).unsqueeze(-1), torch.exp(lse_old - top).unsqueeze(-1)
    merged = (out.float() * w_new + out_old.float() * w_old) / (w_new + w_old)
    return merged[0].transpose(0, 1).to(q.dtype)


def unsupported_reason(q, k_cache, v_cache, soft_cap, k_scale, v_scale, out) -> str | None:
    """Why this path cannot take the call (None when it can)."""
    if q.dtype not in Q_DTYPES:
        return f"q dtype {q.dtype}"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return f"cache dtypes {k_cache.dtype}/{v_cache.dtype} with q {q.dtype} (fp8 caches need dequantising)"
    if soft_cap is not None and soft_cap > 0:
        return "soft cap"
    if k_scale is not None or v_scale is not None:
        return "k/v scales"
    if q.dim() != 3 or k_cache.dim() != 4 or q.shape[1] % k_cache.shape[2] or k_cache.shape[3] != q.shape[2]:
        return f"shapes q {list(q.shape)} cache {list(k_cache.shape)}"
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype):
        return "out is not a [T, Hq, D] tensor of q's dtype"
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "CUDA-graph capture (the lengths are read on the host)"
    return None


class SplitPrefill:
    """The op with its per-step host lengths and its backend choice (a probe at first use)."""

    def __init__(self, backend: str | None = None):
        self.backend = backend or os.environ.get(BACKEND_ENV, "flash")
        if self.backend not in ("cudnn", "flash"):
            raise ValueError(f"{BACKEND_ENV}={self.backend!r}: expected 'cudnn' or 'flash'")
        self._lock = threading.Lock()
        self._lengths_key, self._held, self._lengths = None, None, None
        self._probed: dict[tuple, str | None] = {}  # (device, dtype, head dim) -> why not (None: fine)
        self.host_reads = 0  # lengths read back (one per step in serving)
        self.failed: str | None = None  # why a real call failed (then every call is handed on)

    def _host_lengths(self, query_start_loc, seq_lens, host_lengths) -> tuple[list[int], list[int]]:
        if host_lengths is not None:  # the engine's plan: no read-back
            return host_lengths.as_lists()
        key = (metadata_identity(query_start_loc), metadata_identity(seq_lens))
        with self._lock:
            if key != self._lengths_key:
                host = torch.cat([query_start_loc.to(torch.int64), seq_lens.to(torch.int64)]).cpu().tolist()
                b = seq_lens.shape[0]
                self._lengths_key, self._held = key, (query_start_loc, seq_lens)  # held: addresses stay theirs
                self._lengths = (host[: b + 1], host[b + 1 :])
                self.host_reads += 1
            return self._lengths

    def _probe(self, q: torch.Tensor) -> str | None:
        """Run the backend once per dtype and head dim on tiny problems (a rectangle, a causal
        square) against plain math, output and log-sum-exp both: the merge is only as right as the
        LSE's convention (natural log of the scaled scores' exp-sum), which these ops do not document."""
        key = (q.device, q.dtype, q.shape[2])
        if key not in self._probed:
            self._probed[key] = self._check_backend(q.device, q.dtype, q.shape[2])
            if self._probed[key] is not None:
                _LOG.warning("sdpa_split_prefill hands every call on: %s", self._probed[key])
        return self._probed[key]

    def _check_backend(self, device, dtype, d: int) -> str | None:
        g = torch.Generator(device="cpu").manual_seed(0)
        scale = d**-0.5
        for lq, lk, causal in ((8, 24, False), (24, 24, True)):
            qq, kk, vv = (torch.randn(1, 2, n, d, generator=g).to(device, dtype) for n in (lq, lk, lk))
            try:
                out, lse = _attend(qq, kk, vv, causal, scale, self.backend)
            except Exception as e:  # noqa: BLE001 - an absent or broken backend: use the next kernel
                return f"{self.backend} backend unavailable: {type(e).__name__}: {str(e)[:120]}"
            scores = (qq.float() @ kk.float().transpose(-1, -2)) * scale
            if causal:
                scores = scores.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=device).triu(1), float("-inf"))
            want_out = torch.softmax(scores, -1) @ vv.float()
            want_lse = torch.logsumexp(scores, -1)
            if (out.float() - want_out).abs().max().item() > 0.05:
                return f"{self.backend} backend gave wrong outputs (causal={causal})"
            if (lse - want_lse).abs().max().item() > 0.02:
                return f"{self.backend} backend's log-sum-exp is not the natural log of the scaled scores"
        return None

    def __call__(self, q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *, scale, out=None,
                 host_lengths=None):
        """None when the call is not one this path takes (the caller goes to the next kernel)."""
        if self._probe(q) is not None or self.failed is not None:
            return None
        starts, lens = self._host_lengths(query_start_loc, seq_lens, host_lengths)
        if out is None:
            out = torch.empty_like(q)
        page_size = k_cache.shape[1]
        try:
            for b, total in enumerate(lens):
                first, last = starts[b], starts[b + 1]
                if last == first:
                    continue
                pages = page_table[b, : -(-total // page_size)].long()
                keys = k_cache.index_select(0, pages).flatten(0, 1)[:total]
                values = v_cache.index_select(0, pages).flatten(0, 1)[:total]
                out[first:last] = attend_request(q[first:last], keys, values, total - (last - first), scale,
                                                 self.backend)
        except (RuntimeError, NotImplementedError) as e:
            # a shape the backend refuses (its limits are not all known up front): this call and every
            # later one go to the next kernel, which rewrites all of `out`
            self.failed = f"{self.backend} backend failed: {type(e).__name__}: {str(e)[:160]}"
            _LOG.warning("sdpa_split_prefill hands this and every later call on: %s", self.failed)
            return None
        return out


SPLIT: SplitPrefill | None = None  # made at the first call: a bad LIGHTSPEED_SDPA_PREFILL_BACKEND fails there


def _split() -> SplitPrefill:
    global SPLIT
    if SPLIT is None:
        SPLIT = SplitPrefill()
    return SPLIT


@register_kernel("attention", "prefill", name=KERNEL, solution="torch_sdpa", priority=Priority.PORTABLE,
                 dtypes=Q_DTYPES, capability={"vendors": ("nvidia",), "min_compute_capability": (8, 0)},
                 features=("fp8_kv", "soft_cap", "gqa"), tags=("sdpa",))  # the first two: handed on
def sdpa_split_prefill(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *, max_query_len, scale,
                       soft_cap=None, k_scale=None, v_scale=None, out=None, host_lengths=None):
    """Paged causal prefill over a cached prefix via torch's fused attention (opt-in: see the module note)."""
    if unsupported_reason(q, k_cache, v_cache, soft_cap, k_scale, v_scale, out) is None:
        got = _split()(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, scale=scale, out=out,
                       host_lengths=host_lengths)
        if got is not None:
            return got
    return next_attention_kernel("prefill", q, k_cache, v_cache, page_table, query_start_loc, seq_lens,
                                 max_query_len=max_query_len, scale=scale, soft_cap=soft_cap, k_scale=k_scale,
                                 v_scale=v_scale, out=out, host_lengths=host_lengths)


__all__ = ["BACKEND_ENV", "KERNEL", "SPLIT", "SplitPrefill", "attend_request", "sdpa_split_prefill",
           "unsupported_reason"]
