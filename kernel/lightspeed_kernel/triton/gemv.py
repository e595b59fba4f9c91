"""Skinny GEMM for decode (gemm/bf16 with 1..64 rows): read each weight byte once, at HBM speed.

At one row it is the default on the H200 (`triton_gemv_one_row`, measured through the engine);
at more rows it is opt-in. Its GPU tests pass on the H200, and the sweep
there (bench/results/gemv_2026-12-02_0437_nvidia-h200/) has its best launch 1.06-1.13x faster than
cuBLAS on the Llama-8B decode GEMMs at one row (qkv, o, gate_up, down; 1.03x on a 128K LM head),
level or slower at two rows except gate_up; 17..64 rows (the decode steps of 32-64 requests, where
cuBLAS reads the weights at ~75% of HBM: bench/results/profile_gpu_2026-12-07_1427_h100/) are not measured
yet (`tools/bench/gemv.py --m 32,64`). The any-row kernel registers as `triton_gemv` in the
PORTABLE band, below `cublas_linear` (F.linear, PERFORMANT); the default on NVIDIA GPUs is
`triton_gemv_one_row` (PERFORMANT + 1), which runs it at one row where measured and hands every
other call to F.linear, so a default call of more rows still goes to cuBLAS. Select any rows with
`LIGHTSPEED_KERNEL_OVERRIDE_GEMM_BF16=triton_gemv` or `lk.override(**{"gemm/bf16": "triton_gemv"})`;
`tools/bench/gemv.py` times it against cuBLAS over `sweep_configs`. Calls it does not take (more
than 64 rows, fp32 or mixed dtypes, a weight whose last dim is strided, autograd) go to F.linear,
so the override is safe model-wide (an MoE router's fp32 linear, prefill).

Design note. At M <= 64 rows a linear layer does 2·M·N·K flops on N·K·2 weight bytes, at most 64 FLOP
a byte: below the H200's ridge point (~190), so the time is the weight read (4.27 TB/s) plus launch latency. Each
program owns BLOCK_N output columns (weight rows) and walks its K range in BLOCK_K steps, loading a
[BLOCK_N, BLOCK_K] weight tile that is contiguous along K (BLOCK_K·2 bytes per row: 16-byte vector
loads, `evict_first` since no weight byte is read twice), the x rows beside it (M·K·2 bytes, at most
448 KB for the 8B shapes: L2-resident, `evict_last`), accumulating in fp32; num_stages > 1 keeps
that many tiles in flight through a cp.async ring in shared memory. Two inner products:
- FMA (`use_dot=False`, the default up to 2 rows): per x row, products in registers and a sum
  along K; nothing is padded, so at one row no lane does wasted work.
- tensor cores (`use_dot=True`, swap-AB): acc[BLOCK_N, BLOCK_M] += W_tile @ x_tileᵀ (wgmma on sm_90).
  The weight rows sit on the MMA's M side and the 1..64 x rows on its N side (padded to 16, 32 or 64
  with masked, unread rows), so the MMA's minimum tile wastes compute, never bandwidth.
Split-K (`split_k > 1`) for shapes with too few column blocks to keep every SM's loads in flight
(o_proj and down_proj: 4096 columns): programs on a (column block, K range) grid write fp32 partials
to a workspace [split_k, M, N], and a second kernel sums them in split order, adds the bias and
rounds once. Chosen over fp32 atomics because atomics need the workspace zeroed first (a memset
launch, so no fewer launches) and make the sum's order, hence the bf16 result, vary run to run.
PDL (sm_90+, see _common.pdl_args): the first weight tile is loaded before the grid-dependency wait, so
it streams in while the kernel this GEMM reads finishes (weights are never written by a kernel); the
sums keep their order, so the bits match a launch without it.
CUDA graphs: the launch depends on (M, N, K, SM count) only; nothing reads the device; with
`workspace=` given nothing is allocated but the output (like F.linear), and without it the
partials come from the caching allocator (the capturing graph's pool under capture).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..registry import Priority, register_kernel
from ..registry.platform import platform_of
from ._common import FLOAT_DTYPES, check, dot_upcast, interpreting, next_pow2, pdl_args, pdl_enter

MAX_ROWS = 64  # more rows than this go to cuBLAS (a real GEMM then)
KERNEL_NAME = "triton_gemv"
SMEM_BUDGET = 200 * 1024  # of the H200's 227 KB per block, leaving room for the layout's padding


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    """One launch of the skinny GEMM (the axes of the H200 sweep)."""

    block_n: int  # output columns (weight rows) per program
    block_k: int  # K elements per step and weight row (x2 bytes contiguous)
    split_k: int  # programs along K per column block; > 1 adds the fp32 partials + reduce pass
    num_warps: int
    num_stages: int
    use_dot: bool  # tensor-core swap-AB dot (x rows padded to 16 / 32 / 64) instead of FMA + sum along K

    def block_m(self, rows: int) -> int:
        return max(16, next_pow2(rows)) if self.use_dot else next_pow2(rows)

    def smem_bytes(self, rows: int) -> int:
        """Shared memory of the pipelined weight and x tiles (an estimate; the compile check measures)."""
        if self.num_stages <= 1:
            return 0
        return self.num_stages * (self.block_n + self.block_m(rows)) * self.block_k * 2


def _split_k_candidates(n_blocks: int, k: int, block_k: int, num_sms: int) -> list[int]:
    """1, then each power of two up to 8 that keeps the grid within 4 waves and every split at
    least two K steps long."""
    splits = [1]
    for s in (2, 4, 8):
        if n_blocks * s <= max(4 * num_sms, n_blocks) and triton.cdiv(k, s) >= 2 * block_k:
            splits.append(s)
    return splits


def sweep_configs(m: int, n: int, k: int, num_sms: int) -> list[GemvConfig]:
    """The sweep space for (M, N, K) on a GPU of `num_sms` SMs, choose_config's pick (a member) first.

    FMA (up to 4 rows): block_n 16/32/64 x block_k 256/512 x 4/8 warps, at most 64 weight elements
    per thread (the fp32 products stay in registers), x stages 1 (loads straight into registers,
    latency hidden by occupancy) or 3 (a cp.async ring in shared memory). Tensor cores (2 rows and
    up): block_n 32/64/128 x block_k 128/256 x 4/8 warps x 3/4 stages within SMEM_BUDGET; above 16
    rows block_n 64/128/256 x block_k 64/128/256 x 3/4/5 stages (a wider x tile leaves fewer bytes of
    the ring to the weights). Each with the split_k values of `_split_k_candidates`. For the 8B decode shapes at 132 SMs: 16-42
    configs per shape at 1 row, 36-114 at 2-4 rows, 20-72 at 8-16 rows (185 distinct kernels). Every
    path keeps the fp32 accumulator at most 64 elements a thread (no spills).
    """
    found: list[GemvConfig] = []
    paths = [(False, (16, 32, 64), (256, 512), (1, 3))] if m <= 4 else []
    if 2 <= m <= 16:
        paths.append((True, (32, 64, 128), (128, 256), (3, 4)))
    elif m > 16:
        paths.append((True, (64, 128, 256), (64, 128, 256), (3, 4, 5)))
    for use_dot, block_ns, block_ks, stage_opts in paths:
        for block_n in block_ns:
            for block_k in block_ks:
                for warps in (4, 8):
                    if not use_dot and block_n * block_k > 64 * 32 * warps:
                        continue
                    if use_dot and block_n * max(16, next_pow2(m)) > 64 * 32 * warps:
                        continue
                    for stages in stage_opts:
                        for split in _split_k_candidates(triton.cdiv(n, block_n), k, block_k, num_sms):
                            cfg = GemvConfig(block_n, block_k, split, warps, stages, use_dot)
                            if cfg.smem_bytes(m) <= SMEM_BUDGET:
                                found.append(cfg)
    chosen = choose_config(m, n, k, num_sms)
    return sorted(found, key=lambda c: c != chosen)  # stable: the pick first, then the order above


# The sweep's fastest launch per (M, N, K) on the H200 (132 SMs), from
# bench/results/gemv_2026-12-02_0437_nvidia-h200/ (M = 1 and 2, every config of `sweep_configs`
# timed, L2 flushed): the Llama-8B decode shapes (qkv, o, gate_up, down, a 128K LM head). Fields:
# block_n, block_k, split_k, num_warps, num_stages, use_dot.
MEASURED_H200 = {
    (1, 6144, 4096): GemvConfig(16, 256, 1, 8, 1, False),
    (1, 4096, 4096): GemvConfig(16, 512, 1, 4, 3, False),
    (1, 28672, 4096): GemvConfig(16, 512, 1, 4, 1, False),
    (1, 4096, 14336): GemvConfig(16, 512, 1, 8, 1, False),
    (1, 128256, 4096): GemvConfig(16, 256, 1, 4, 3, False),
    (2, 6144, 4096): GemvConfig(16, 512, 1, 4, 1, False),
    (2, 4096, 4096): GemvConfig(32, 256, 1, 4, 3, True),
    (2, 28672, 4096): GemvConfig(64, 128, 1, 4, 4, True),
    (2, 4096, 14336): GemvConfig(64, 256, 1, 4, 4, True),
    (2, 128256, 4096): GemvConfig(64, 128, 1, 4, 4, True),
}
H200_SMS = 132


@functools.lru_cache(maxsize=1024)
def choose_config(m: int, n: int, k: int, num_sms: int) -> GemvConfig:
    """The launch for (M, N, K): the H200 sweep's winner where it measured that shape (`MEASURED_H200`),
    else FMA with 16 weight rows per program up to 2 rows (every measured one-row winner has 16),
    tensor cores above; K split (powers of two, at most 8) only while the grid is under one wave of
    `num_sms`, each split keeping at least four K steps (no measured winner split a grid of 256 or
    more programs, and the earlier rule of two waves made o_proj 5.8x slower). A pure function of
    shapes (CUDA-graph safe)."""
    if num_sms == H200_SMS and (m, n, k) in MEASURED_H200:
        return MEASURED_H200[m, n, k]
    if m <= 2:
        cfg = GemvConfig(block_n=16, block_k=512, split_k=1, num_warps=8, num_stages=1, use_dot=False)
    else:
        cfg = GemvConfig(block_n=64, block_k=128, split_k=1, num_warps=4, num_stages=4, use_dot=True)
    n_blocks = triton.cdiv(n, cfg.block_n)
    split = 1
    while split < 8 and n_blocks * split < num_sms and triton.cdiv(k, 2 * split) >= 4 * cfg.block_k:
        split *= 2
    return dataclasses.replace(cfg, split_k=split)


@triton.jit
def weight_tile(w_rows, k, n_mask, K):
    """The [BLOCK_N, BLOCK_K] weight tile of rows `w_rows` at columns k, zeros past N and K;
    evict_first: no weight byte is read twice."""
    return tl.load(w_rows + k[None, :], mask=n_mask[:, None] & (k < K)[None, :], other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _accumulate_tile(acc, w, x_ptr, k, k_mask, offs_m, m_mask, M, stride_xm,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr):
    """acc[BLOCK_N, BLOCK_M] += w[BLOCK_N, BLOCK_K] @ x[:, k]ᵀ (x's rows loaded here)."""
    if USE_DOT:
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=m_mask[:, None] & k_mask[None, :],
                    other=0.0, eviction_policy="evict_last")  # [BLOCK_M, BLOCK_K]
        if DOT_FP32:  # the interpreter's bf16 dot is wrong (see _common.dot_upcast)
            acc = tl.dot(w.to(tl.float32), tl.trans(x.to(tl.float32)), acc)
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    else:
        wf = w.to(tl.float32)
        offs_k = tl.arange(0, BLOCK_K)
        for row in tl.static_range(BLOCK_M):
            x_row = tl.load(x_ptr + row * stride_xm + k, mask=k_mask & (offs_k * 0 + row < M), other=0.0,
                            eviction_policy="evict_last").to(tl.float32)  # [BLOCK_K]
            part = tl.sum(wf * x_row[None, :], axis=1)  # [BLOCK_N]
            acc += tl.where(offs_m[None, :] == row, part[:, None], 0.0)
    return acc


@triton.jit
def _skinny_gemm_kernel(
    x_ptr, w_ptr, bias_ptr, out_ptr, ws_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr, USE_PDL: tl.constexpr,
    PREFETCH_W: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k_start = pid_k * k_per_split
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # out^T tile: columns x rows
    if PREFETCH_W:
        # No kernel writes a weight: under PDL this program's first weight tile streams in before the
        # wait, while the kernel before it (the norm or attention this GEMM reads) finishes.
        k = k_start + offs_k
        w = weight_tile(w_rows, k, n_mask, K)
        pdl_enter(USE_PDL)
        acc = _accumulate_tile(acc, w, x_ptr, k, k < K, offs_m, m_mask, M, stride_xm, BLOCK_M, BLOCK_K, USE_DOT,
                               DOT_FP32)
    else:
        pdl_enter(USE_PDL)
    # the loop's own num_stages: without it Triton pipelines only loads that feed a dot, and the
    # FMA path's weight loads would wait in registers (compiled for sm_90: no async copies)
    for kk in tl.range(BLOCK_K if PREFETCH_W else 0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        k = k_start + kk + offs_k
        k_mask = k < K
        w = weight_tile(w_rows, k, n_mask, K)  # [BLOCK_N, BLOCK_K]
        acc = _accumulate_tile(acc, w, x_ptr, k, k_mask, offs_m, m_mask, M, stride_xm, BLOCK_M, BLOCK_K, USE_DOT,
                               DOT_FP32)
    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT:  # fp32 partial of this K range; _split_k_reduce_kernel finishes
        ws = ws_ptr + (pid_k * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
        tl.store(ws, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
        out = out_ptr + offs_m[None, :] * stride_om + offs_n[:, None]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_k_reduce_kernel(ws_ptr, bias_ptr, out_ptr, M, N, stride_om, HAS_BIAS: tl.constexpr,
                           SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_enter(USE_PDL)
    row = tl.program_id(1)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # fixed order: the same bits on every run
        acc += tl.load(ws_ptr + (s * M + row).to(tl.int64) * N + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether the skinny GEMM runs this call (else it goes to F.linear): x [M <= 64, K] and weight
    [N, K] of one 16-bit float dtype with contiguous last dims, bias None or [N] of that dtype, on a
    CUDA device (or the CPU under TRITON_INTERPRET=1), no autograd."""
    if not (isinstance(weight, torch.Tensor) and x.dim() == 2 and weight.dim() == 2):
        return False
    m, k = x.shape
    n = weight.shape[0]
    if not (1 <= m <= MAX_ROWS and k > 0 and n > 0 and weight.shape[1] == k):
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype:
        return False
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.device != x.device:
        return False
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype or bias.device != x.device):
        return False
    if not (x.is_cuda or interpreting()):
        return False
    grads = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    return not (grads and torch.is_grad_enabled())


def workspace_elements(m: int, n: int, config: GemvConfig) -> int:
    """fp32 elements of the split-K workspace a launch of `config` needs (0 without split-K)."""
    return config.split_k * m * n if config.split_k > 1 else 0


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: GemvConfig,
           workspace: torch.Tensor | None = None, *, prefetch_weights: bool | None = None) -> torch.Tensor:
    """Run `config` on a call that `takes` accepts: x [M, K], weight [N, K], bias [N] -> [M, N].
    prefetch_weights: load the first weight tile before the PDL wait (default: when launched with
    PDL; the same sums either way, tests force it on in the interpreter)."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    split = config.split_k
    k_per_split = triton.cdiv(triton.cdiv(k, split), config.block_k) * config.block_k
    needed = workspace_elements(m, n, config)
    if needed == 0:
        ws = out  # never written: SPLIT is off
    elif workspace is None:
        ws = torch.empty(needed, dtype=torch.float32, device=x.device)
    else:
        check(workspace.dtype == torch.float32 and workspace.is_contiguous() and workspace.numel() >= needed
              and workspace.device == x.device,
              f"workspace must be a contiguous fp32 tensor of >= {needed} elements on {x.device}")
        ws = workspace
    bias_arg = bias if bias is not None else out
    pdl = pdl_args(x.device)
    _skinny_gemm_kernel[(triton.cdiv(n, config.block_n), split)](
        x, weight, bias_arg, out, ws, m, n, k, k_per_split, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, SPLIT=split > 1, BLOCK_M=config.block_m(m), BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, USE_DOT=config.use_dot, DOT_FP32=dot_upcast(), NUM_STAGES=config.num_stages,
        PREFETCH_W=pdl["USE_PDL"] if prefetch_weights is None else prefetch_weights,
        num_warps=config.num_warps, num_stages=config.num_stages, **pdl,
    )
    if split > 1:
        block = min(1024, next_pow2(n))
        _split_k_reduce_kernel[(triton.cdiv(n, block), m)](
            ws, bias_arg, out, m, n, out.stride(0), HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK=block,
            num_warps=4, **pdl_args(x.device),
        )
    return out


@register_kernel("gemm", "bf16", name=KERNEL_NAME, solution="triton", priority=Priority.PORTABLE,
                 capability={"vendors": ("nvidia",), "min_compute_capability": (8, 0)}, dtypes=FLOAT_DTYPES,
                 tags=("triton",))
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           config: GemvConfig | None = None, workspace: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias``: x [M, K], weight [N, K], bias [N] -> [M, N] in x's dtype (fp32
    accumulation, one rounding). `config`: the launch (default `choose_config`); `workspace`: fp32,
    at least `workspace_elements` elements, for split-K without an allocation. Calls `takes` rejects
    go to F.linear."""
    if not takes(x, weight, bias):
        return F.linear(x, weight, bias)
    m, k = x.shape
    if config is None:
        config = choose_config(m, weight.shape[0], k, platform_of(x.device).sm_count or 1)
    return launch(x, weight, bias, config, workspace)


ONE_ROW_KERNEL_NAME = "triton_gemv_one_row"


def takes_one_row(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """The calls where the skinny GEMM measured faster than cuBLAS: one row (batch-1 decode) on a GPU
    of the H200's SM count, for a shape of MEASURED_H200 or one at least as large on both sides
    (4096+ columns and K: the rule's launch there is the measured winners' family, no split K).
    Narrower projections (MLA's, small models') have not been measured against cuBLAS: F.linear."""
    if not (x.dim() == 2 and x.shape[0] == 1 and takes(x, weight, bias)):
        return False
    if not (interpreting() or platform_of(x.device).sm_count == H200_SMS):
        return False
    n, k = weight.shape
    return (1, n, k) in MEASURED_H200 or (n >= 4096 and k >= 4096) or interpreting()


# The default gemm/bf16 kernel on NVIDIA GPUs: above cublas_linear, since it hands every call it does
# not take to F.linear. Measured through the engine on the H200 (bench/results/
# h200_gemv_one_row_2026-12-03_1506/, llama-3.1-8b preset, 1K context): batch-1 step 4.82 vs 4.88 ms
# with cuBLAS, 356 vs 420 kernels a step (no split-K reduce launches).
@register_kernel("gemm", "bf16", name=ONE_ROW_KERNEL_NAME, solution="triton",
                 priority=Priority.of(Priority.PERFORMANT, 1),
                 capability={"vendors": ("nvidia",), "min_compute_capability": (8, 0)}, dtypes=FLOAT_DTYPES,
                 tags=("triton", "cublas"))
def linear_one_row(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The skinny GEMM where `takes_one_row` (batch-1 decode on the H200), F.linear (cuBLAS) for
    everything else: at two rows and more the sweep has cuBLAS level or faster."""
    if not takes_one_row(x, weight, bias):
        return F.linear(x, weight, bias)
    return launch(x, weight, bias, choose_config(1, weight.shape[0], x.shape[1], H200_SMS))


# cuBLAS for every gemm/bf16 call triton_gemv_one_row does not take. The reference (the same F.linear) sits in the
# REFERENCE band, which any PORTABLE kernel outranks; this puts cuBLAS explicitly above triton_gemv
# until the H200 sweep says where the skinny GEMM wins (raise triton_gemv above it then).
@register_kernel("gemm", "bf16", name="cublas_linear", solution="torch", priority=Priority.PERFORMANT,
                 capability="nvidia", tags=("cublas",))
def cublas_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear (cuBLAS / cuBLASLt): x [T, K], weight [N, K], bias [N] -> [T, N]."""
    return F.linear(x, weight, bias)
