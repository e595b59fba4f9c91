"""An MLP's SiLU-and-mul folded into the one-row down projection (activation/silu_and_mul_linear at
batch 1).

Why: at batch 1 the activation is a 32-launch-a-step kernel of its own (39 us a step on the H200, plus
its two boundaries with the GEMMs around it: bench/results/h200_pdl_2026-12-03_1800/). The down
projection's skinny GEMM reads the whole [gate | up] row in every program anyway, so it computes
silu(gate) * up as it loads each K tile, rounded to x's dtype as the activation kernel rounds its
output, then multiplies exactly as the skinny GEMM does (same tiles, same fp32 order per tile).
One row, no split K, FMA inner product; every other call goes to `composed_silu_and_mul_linear`.

Not the default: through the engine it measured slower than the composition (batch-1 step 5.08 vs 4.78 ms,
bench/results/h200_fusions_ab_2026-12-04_0357/); it registers below it (LIGHTSPEED_KERNEL_OVERRIDE_ACTIVATION_SILU_AND_MUL_LINEAR=triton_silu_and_mul_gemv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..composed import silu_and_mul_linear as composed_silu_and_mul_linear
from ..registry import Priority, register_kernel
from ._common import FLOAT_DTYPES, interpreting, pdl_args, pdl_enter
from .gemv import H200_SMS, GemvConfig, choose_config, weight_tile

KERNEL_NAME = "triton_silu_and_mul_gemv"


@triton.jit
def _act_tile(acc, w, x_ptr, k, k_mask, inter):
    """acc += W_tile (silu(gate) * up)[k], the activation rounded to x's dtype first."""
    gate = tl.load(x_ptr + k, mask=k_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    up = tl.load(x_ptr + inter + k, mask=k_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    y = (gate * tl.sigmoid(gate) * up).to(x_ptr.dtype.element_ty).to(tl.float32)
    return acc + tl.sum(w.to(tl.float32) * y[None, :], axis=1)


@triton.jit
def _silu_mul_gemv_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr,
    N, inter, stride_wn,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
    USE_PDL: tl.constexpr, PREFETCH_W: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH_W:  # weights are never written by a kernel: the first tile streams in before the wait
        w = weight_tile(w_rows, offs_k, n_mask, inter)
        pdl_enter(USE_PDL)
        acc = _act_tile(acc, w, x_ptr, offs_k, offs_k < inter, inter)
    else:
        pdl_enter(USE_PDL)
    for k0 in tl.range(BLOCK_K if PREFETCH_W else 0, inter, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + offs_k
        k_mask = k < inter
        w = weight_tile(w_rows, k, n_mask, inter)
        acc = _act_tile(acc, w, x_ptr, k, k_mask, inter)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """One [gate | up] row of a 16-bit float, weight [N, I] and bias of its dtype and device, contiguous;
    an H200-sized GPU (the one-row launches were measured there) or the interpreter."""
    if not (isinstance(weight, torch.Tensor) and x.dim() == 2 and weight.dim() == 2 and x.shape[0] == 1):
        return False
    tensors = [x, weight] + ([bias] if bias is not None else [])
    if x.dtype not in (torch.bfloat16, torch.float16) or any(t.dtype != x.dtype for t in tensors):
        return False
    if any(t.device != x.device or not t.is_contiguous() for t in tensors):
        return False
    if x.shape[1] != 2 * weight.shape[1] or (bias is not None and bias.shape != (weight.shape[0],)):
        return False
    if interpreting():
        return x.device.type == "cpu"
    return x.is_cuda and torch.cuda.get_device_properties(x.device).multi_processor_count == H200_SMS


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           config: GemvConfig | None = None, prefetch_weights: bool | None = None) -> torch.Tensor:
    """Run a call `takes` accepts -> [1, N]."""
    n, inter = weight.shape
    if config is None:
        config = choose_config(1, n, inter, H200_SMS)
    out = torch.empty((1, n), dtype=x.dtype, device=x.device)
    pdl = pdl_args(x.device)
    _silu_mul_gemv_kernel[(triton.cdiv(n, config.block_n),)](
        x, weight, bias if bias is not None else out, out, n, inter, weight.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=config.block_n, BLOCK_K=config.block_k, NUM_STAGES=config.num_stages,
        PREFETCH_W=pdl["USE_PDL"] if prefetch_weights is None else prefetch_weights,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl,
    )
    return out


@register_kernel("activation", "silu_and_mul_linear", name=KERNEL_NAME, solution="triton",
                 priority=Priority.PORTABLE, capability={"vendors": ("nvidia",), "min_compute_capability": (8, 0)},
                 dtypes=FLOAT_DTYPES, tags=("triton",))
def silu_and_mul_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The fused kernel where `takes`, else the composition (see the module note)."""
    if not takes(x, weight, bias):
        return composed_silu_and_mul_linear(x, weight, bias)
    return launch(x, weight, bias)
