"""A decoder block's norm folded into the one-row projection after it (norm/rms_linear at batch 1).

Why: a batch-1 decode step on the H200 spends 168 us in 64 one-program RMSNorm launches and 54 us
more idle at their boundaries with the GEMMs (bench/results/h200_pdl_2026-12-03_1800/). The skinny
GEMM already reads the whole activation row in every program, so it can normalise it as it goes:

    h = x + residual (rounded to x's dtype, what the next block reads back as its residual)
    out = (sum_k W[n, k] * h[k] * g[k]) * rsqrt(mean(h^2) + eps)

Each program accumulates sum(h^2) beside the dot products over its K loop and scales once at the
end; program 0 writes h. The normed activations are never rounded to bf16 (the unfused path rounds
them once), so results differ from the composed op by bf16 rounding, not bit for bit. One row, no
split K (the one-row launches of the H200 sweep have none), FMA inner product; every other call goes
to `composed_rms_norm_linear`.

Not the default: through the engine it measured slower than the composition (batch-1 step 4.91 vs 4.79 ms,
bench/results/h200_fusions_ab_2026-12-04_0357/); it registers below it
(select it with LIGHTSPEED_KERNEL_OVERRIDE_NORM_RMS_LINEAR=triton_rms_norm_gemv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..composed import rms_norm_linear as composed_rms_norm_linear
from ..registry import Priority, register_kernel
from ._common import FLOAT_DTYPES, interpreting, pdl_args, pdl_enter
from .gemv import H200_SMS, GemvConfig, choose_config, weight_tile

KERNEL_NAME = "triton_rms_norm_gemv"


@triton.jit
def _norm_tile(acc, sumsq, w, x_ptr, res_ptr, g_ptr, h_ptr, k, k_mask, pid, HAS_RESIDUAL: tl.constexpr):
    """One K tile: h = x (+ residual, rounded; program 0 stores it), sum(h^2), acc += W (h * g)."""
    h = tl.load(x_ptr + k, mask=k_mask, other=0.0, eviction_policy="evict_last")
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + k, mask=k_mask, other=0.0, eviction_policy="evict_last")
        h = (h.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        if pid == 0:
            tl.store(h_ptr + k, h, mask=k_mask)
    hf = h.to(tl.float32)
    y = hf * tl.load(g_ptr + k, mask=k_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return acc + tl.sum(w.to(tl.float32) * y[None, :], axis=1), sumsq + hf * hf


@triton.jit
def _rms_norm_gemv_kernel(
    x_ptr, res_ptr, g_ptr, w_ptr, bias_ptr, out_ptr, h_ptr,
    N, K, eps, stride_wn,
    HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH_W: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_K], dtype=tl.float32)
    if PREFETCH_W:  # weights are never written by a kernel: the first tile streams in before the wait
        w = weight_tile(w_rows, offs_k, n_mask, K)
        pdl_enter(USE_PDL)
        acc, sumsq = _norm_tile(acc, sumsq, w, x_ptr, res_ptr, g_ptr, h_ptr, offs_k, offs_k < K, pid, HAS_RESIDUAL)
    else:
        pdl_enter(USE_PDL)
    for k0 in tl.range(BLOCK_K if PREFETCH_W else 0, K, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + offs_k
        k_mask = k < K
        w = weight_tile(w_rows, k, n_mask, K)
        acc, sumsq = _norm_tile(acc, sumsq, w, x_ptr, res_ptr, g_ptr, h_ptr, k, k_mask, pid, HAS_RESIDUAL)
    acc = acc / tl.sqrt(tl.sum(sumsq, axis=0) / K + eps)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def takes(x, residual, norm_weight, weight, bias) -> bool:
    """One row of a 16-bit float on a CUDA GPU (or the interpreter), every tensor of x's dtype and device,
    contiguous; an H200-sized GPU (the one-row launches were measured there) or the interpreter."""
    if not (isinstance(weight, torch.Tensor) and x.dim() == 2 and weight.dim() == 2 and x.shape[0] == 1):
        return False
    k = x.shape[1]
    tensors = [x, norm_weight, weight] + [t for t in (residual, bias) if t is not None]
    if x.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != x.dtype for t in tensors):
        return False
    if any(t.device != x.device or not t.is_contiguous() for t in tensors):
        return False
    if weight.shape[1] != k or norm_weight.shape != (k,) or (residual is not None and residual.shape != x.shape):
        return False
    if bias is not None and bias.shape != (weight.shape[0],):
        return False
    if interpreting():
        return x.device.type == "cpu"
    return x.is_cuda and torch.cuda.get_device_properties(x.device).multi_processor_count == H200_SMS


def launch(x, residual, norm_weight, eps, weight, bias=None, *, config: GemvConfig | None = None,
           prefetch_weights: bool | None = None):
    """Run a call `takes` accepts -> (out [1, N], h [1, H])."""
    n, k = weight.shape
    if config is None:
        config = choose_config(1, n, k, H200_SMS)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    h = torch.empty_like(x) if residual is not None else x  # a new buffer: other programs still read residual
    pdl = pdl_args(x.device)
    _rms_norm_gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x, residual if residual is not None else x, norm_weight, weight, bias if bias is not None else out, out, h,
        n, k, float(eps), weight.stride(0),
        HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, NUM_STAGES=config.num_stages,
        PREFETCH_W=pdl["USE_PDL"] if prefetch_weights is None else prefetch_weights,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl,
    )
    return out, h


@register_kernel("norm", "rms_linear", name=KERNEL_NAME, solution="triton", priority=Priority.PORTABLE,
                 capability={"vendors": ("nvidia",), "min_compute_capability": (8, 0)}, dtypes=FLOAT_DTYPES,
                 tags=("triton",))
def rms_norm_linear(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel where `takes`, else the composition (see the module note)."""
    if not takes(x, residual, norm_weight, weight, bias):
        return composed_rms_norm_linear(x, residual, norm_weight, eps, weight, bias)
    return launch(x, residual, norm_weight, eps, weight, bias)
