"""FP8 e4m3 GEMM with 128x128 block scales on B and 1x128 (per-token, per-K-block) scales on A.

out[m, n] = sum_kb (a[m, kb] . b[n, kb]) * a_scale[m, kb] * b_scale[n // 128, kb]: each BLOCK_K = 128
step is one fp8 tensor-core dot rescaled into the fp32 accumulator (DeepSeek-V3 style).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check, interpreting, register

SCALE_BLOCK = 128


@triton.jit
def _fp8_block_gemm_kernel(
    a_ptr,
    as_ptr,
    b_ptr,
    bs_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_asm,
    stride_bn,
    stride_bsn,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row tiles share each B column tile while it is in L2
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    a_rows = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am
    b_rows = b_ptr + offs_n.to(tl.int64)[:, None] * stride_bn
    as_rows = as_ptr + offs_m.to(tl.int64) * stride_asm
    bs_rows = bs_ptr + (offs_n // BLOCK_K).to(tl.int64) * stride_bsn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k = kb * BLOCK_K + offs_k
        k_mask = k < K
        a = tl.load(a_rows + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        a_s = tl.load(as_rows + kb, mask=m_mask, other=0.0)
        b_s = tl.load(bs_rows + kb, mask=n_mask, other=0.0)
        acc += tl.dot(a, tl.trans(b)) * a_s[:, None] * b_s[None, :]
    c = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@register("gemm", "fp8_block", "triton_fp8_block_gemm", (torch.float8_e4m3fn,), min_cc=(8, 9))
def fp8_block_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """a: [M, K] e4m3, a_scale: [M, ceil(K/128)] fp32, b: [N, K] e4m3, b_scale: [ceil(N/128), ceil(K/128)]
    fp32 -> [M, N] out_dtype."""
    check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[1], "a must be [M, K] and b [N, K]")
    check(a.dtype == torch.float8_e4m3fn and b.dtype == torch.float8_e4m3fn, "a and b must be float8_e4m3fn")
    m, k = a.shape
    n = b.shape[0]
    kb = triton.cdiv(k, SCALE_BLOCK)
    check(a_scale.shape == (m, kb) and a_scale.dtype == torch.float32, f"a_scale must be fp32 [{m}, {kb}]")
    check(
        b_scale.shape == (triton.cdiv(n, SCALE_BLOCK), kb) and b_scale.dtype == torch.float32,
        f"b_scale must be fp32 [{triton.cdiv(n, SCALE_BLOCK)}, {kb}]",
    )
    check(
        a.stride(1) == 1 and b.stride(1) == 1 and a_scale.stride(1) == 1 and b_scale.stride(1) == 1,
        "last dims must be contiguous",
    )
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if interpreting():
        block_m, block_n, warps, stages = 16, 32, 4, 1
    elif m <= 64:  # decode-sized: weight-bandwidth bound, many column tiles in flight
        block_m, block_n, warps, stages = 16 if m <= 16 else 64, 64, 4, 4
    else:
        block_m, block_n, warps, stages = 128, 128, 8, 3
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_block_gemm_kernel[grid](
        a,
        a_scale,
        b,
        b_scale,
        out,
        m,
        n,
        k,
        a.stride(0),
        a_scale.stride(0),
        b.stride(0),
        b_scale.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=SCALE_BLOCK,
        GROUP_M=8,
        num_warps=warps,
        num_stages=stages,
    )
    return out
