"""`mla_decode_sm90`: the absorbed MLA decode as a CUDA kernel for sm_90a (Hopper), JIT-built with nvcc.

The kernels (cuda/mla_decode_sm90_*.cu, design note atop cuda/sm90_decode_common.cuh) are the plan of
mla/NOTES.md: one CTA per (request, split, 64 rows of (query token, head) pairs), TMA loads of 64-key
page tiles into a 2-stage shared-memory ring fed by a producer warpgroup, two consumer warpgroups running
wgmma (S = Q K^T split by keys, P V split by the 512 latent columns), online softmax, split-KV partials
merged by the Triton combine of kernels/decode_triton.py. Both cache formats: bf16 (the packed
[pages, page_size, 576] tensor) and FP8 (e4m3 latent, one fp32 scale a token, bf16 rope): the latent
tile is widened exactly to bf16 in shared memory and P V runs in bf16 with the per-token scale folded
into P; S_latent runs in
bf16 on the widened tile (`mla_decode_sm90`: the Triton FP8 path's accuracy) or on e4m3 MMAs with Q
quantised per row (`mla_decode_sm90_fp8qk`: fewer MMA cycles, ~2-4% from the reference on random data),
or both products on e4m3 MMAs (`mla_decode_sm90_fp8mma`: P V runs as O^T = V^T P^T with V^T the register
operand, which each consumer warp builds from the landed latent tile while its S MMAs run; P is quantised per
tile, and P V of tile i runs beside S of tile i + 1; ~2.7% from the reference; the form before, which
transposed the latent in shared memory, was the fastest FP8 kernel from batch 4).

Plan / run follow `plan_decode` / `run_decode` exactly (the same `MLADecodePlan`, fold layout with
64-row tiles, splits filling one wave of one CTA per SM): planned once from shapes, the true lengths
read on the device, so one captured CUDA graph serves every step.

Build: `torch.utils.cpp_extension.load` on first use, for sm_90a only, into
``lightspeed_kernel.kernel_env().native_cache_dir``/mla_sm90 (LIGHTSPEED_KERNEL_CACHE_DIR); the
module name carries a hash of the sources, so an edited kernel never loads a stale build.
`load_extension(phase_timers=True)` builds a second module (name suffix `_timers`) with
-DLIGHTSPEED_MLA_PHASE_TIMERS: each CTA stamps %globaltimer at the phases of `PHASES`, and sums the cycles
its roles wait (`COUNTERS`), into a buffer
(`phase_timer_buffer`, passed as `run(..., phase_ns=)`); tools/bench/mla_phases.py reads them. The
production module is compiled without it and refuses the buffer.

Registered (when torch has CUDA and nvcc is found) for compute capability exactly 9.0 at PLUGIN + 1,
above `mla_decode_triton` for both caches: on the H200 it was faster than the Triton kernel at every
measured point (mla/NOTES.md, "mla_decode_sm90 on the H200"); FlashInfer's MLA (PLUGIN + 2, bf16 caches
only) stays above it where installed. The engine builds it before its first step (`prepare`), and a
failed build falls back to the next kernel with a warning. `mla_decode_sm90_fp8qk` (e4m3 scores) stays
in the PORTABLE band, opt-in (`LIGHTSPEED_KERNEL_OVERRIDE_MLA_DECODE=mla_decode_sm90_fp8qk`): faster
than `mla_decode_sm90` on FP8 caches but ~2-4% from the reference. `mla_decode_sm90_fp8mma` (e4m3 scores
and e4m3 P V) is opt-in the same way, for the same reason: on an H100 it was 1.24-1.30x fp8qk on the seeds'
FP8 case (mla/NOTES.md, "mla_decode_sm90_fp8mma"), at ~2.7% from the reference (Q's and P's e4m3 rounding).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import torch

from .cache import D_LATENT, D_PACKED, MLACache
from .decode import (
    LOG2E,
    MLADecodePlan,
    _host_i32,
    _layout,
    combine_splits,
    decode_workspace_bytes,
    plan_decode,
)
from .device import device_info
from .tuning import DecodeTile

log = logging.getLogger("lightspeed.mla")
KERNEL_NAME = "mla_decode_sm90"
# The FP8 cache with S_latent on e4m3 MMAs (Q quantised per row): the fast variant the FP8 target
# needs, ~2-4% from the reference on random data (Q's 3 mantissa bits), so a name of its own.
KERNEL_NAME_FP8_SCORES = "mla_decode_sm90_fp8qk"
# Both products on e4m3 MMAs (fp8qk's scores, P V with the latent its register operand, P quantised per tile).
KERNEL_NAME_FP8_MMA = "mla_decode_sm90_fp8mma"
CUDA_DIR = Path(__file__).parent / "cuda"
KERNEL_SOURCES = ("mla_decode_sm90.cu", "mla_decode_sm90_bf16.cu", "mla_decode_sm90_fp8mma.cu")  # no torch headers
SOURCES = ("binding.cpp", *KERNEL_SOURCES)
HEADERS = ("mla_decode_sm90.h", "sm90_launch.h", "sm90_ptx.cuh", "sm90_decode_common.cuh", "sm90_decode_tile.cuh")
CACHE_KINDS = ("bf16", "fp8")
ARCH_FLAG = "-gencode=arch=compute_90a,code=sm_90a"  # wgmma / setmaxnreg need the "a" target
PAGE_SIZES = (8, 16, 32, 64, 128, 256)  # a TMA box holds min(page_size, 64) tokens, >= 8 swizzle rows
FEATURES = ("paged", "bf16_kv", "fp8_kv", "lse", "spec_decode", "causal", "fold_sq", "split_kv", "ragged")
# The phase stamps of the timer build, in the order of cuda/mla_decode_sm90.h's MlaPhase (which says who
# stamps each and when; a CPU test keeps the two in step).
PHASES = ("entry", "work", "first_tma", "last_tma", "q_loaded", "first_tile", "last_vt", "last_pv", "epilogue")
# The cycle counters after the stamps in each CTA's row (MlaCounter: a role's summed wait (or fp8mma's
# fragment building) cycles, and thread 0's %clock64 at entry and after the epilogue, which with the entry /
# epilogue stamps give the cycles' rate).
COUNTERS = ("consumer_wait_full", "consumer_transpose", "producer_wait_empty", "clock_entry", "clock_epilogue")
TIMERS_DEFINE = "-DLIGHTSPEED_MLA_PHASE_TIMERS"
# 64 rows x 64 keys; 12 warps (2 consumer warpgroups + the producer warpgroup), 2 stages, 1 CTA / SM.
TILE = DecodeTile(block_m=64, block_n=64, num_warps=12, num_stages=2, swap_ab=False, ctas_per_sm=1)


class BuildError(RuntimeError):
    """The JIT build failed; the message carries the compiler's output."""


def nvcc_path() -> str | None:
    """The nvcc torch's extension builder would use: $CUDA_HOME / $CUDA_PATH, then PATH, then
    /usr/local/cuda."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if root and os.path.isfile(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    return "/usr/local/cuda/bin/nvcc" if os.path.isfile("/usr/local/cuda/bin/nvcc") else None


def availability() -> tuple[bool, str | None]:
    """(True, None) when this kernel can be built here: a CUDA build of torch and an nvcc."""
    if torch.version.cuda is None:
        return False, f"{KERNEL_NAME} unavailable: torch {torch.__version__} has no CUDA"
    if nvcc_path() is None:
        return False, f"{KERNEL_NAME} unavailable: nvcc not found (CUDA_HOME, PATH, /usr/local/cuda)"
    return True, None


def source_digest() -> str:
    """Hash of the kernel sources: part of the module name, so edits rebuild."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((CUDA_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def default_build_root() -> str:
    import lightspeed_kernel as lk

    return os.path.join(lk.kernel_env().native_cache_dir, "mla_sm90")


def build_options(build_root: str | None = None, verbose: bool = False, phase_timers: bool = False) -> dict:
    """Keyword arguments of `torch.utils.cpp_extension.load` for this kernel. The explicit -gencode
    keeps torch from adding its own arch flags (it would add sm_90 without the "a", where wgmma
    does not assemble). phase_timers: the instrumented module, its own name; the define goes to the
    C++ side too, which must see MlaSm90Args as the kernel does."""
    name = f"lightspeed_mla_sm90_{source_digest()}" + ("_timers" if phase_timers else "")
    root = build_root or default_build_root()
    define = [TIMERS_DEFINE] if phase_timers else []
    return {
        "name": name,
        "sources": [str(CUDA_DIR / s) for s in SOURCES],
        "extra_include_paths": [str(CUDA_DIR)],
        "extra_cflags": ["-O3", *define],
        "extra_cuda_cflags": ["-O3", ARCH_FLAG, "-lineinfo", "-Xptxas=-v", *define],
        "build_directory": os.path.join(root, name),
        "verbose": verbose,
    }


_lock = threading.Lock()
_extensions: dict[bool, object] = {}  # phase_timers -> the loaded module: one of each per process
_failures: dict[str, BuildError] = {}  # build directory -> its failure: not retried in this process (~30 s)


@contextlib.contextmanager
def _exclusive_build(build_dir: str):
    """torch's JIT build guards a build directory with a `lock` file that it deletes when done; a process
    killed mid-build (Ctrl-C during a server's first start terminates the engine core) leaves the file,
    and every later build would wait on it forever. A flock dies with its holder, so while we hold one
    no other build of ours is running here and a `lock` file can only be stale: remove it, then build."""
    with open(os.path.join(build_dir, ".lightspeed-build.flock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a concurrent start (another engine core) waits for our build
        stale = os.path.join(build_dir, "lock")
        if os.path.exists(stale):
            log.warning("%s: removing the build lock an interrupted build left (%s)", KERNEL_NAME, stale)
            os.remove(stale)
        yield


def load_extension(build_root: str | None = None, verbose: bool = False, phase_timers: bool = False):
    """The built module (builds on first call; a failed build raises BuildError with nvcc's output).
    phase_timers: the instrumented build (module docstring), for measurement only."""
    if phase_timers in _extensions:
        return _extensions[phase_timers]
    with _lock:
        opts = build_options(build_root, verbose, phase_timers)
        build_dir = opts["build_directory"]
        if build_dir in _failures:
            raise _failures[build_dir]
        if phase_timers not in _extensions:
            from torch.utils import cpp_extension

            nvcc = nvcc_path()
            if cpp_extension.CUDA_HOME is None and nvcc is not None:  # torch found none: use ours
                cpp_extension.CUDA_HOME = str(Path(os.path.realpath(nvcc)).parent.parent)
            os.makedirs(build_dir, exist_ok=True)
            fresh = not os.path.exists(os.path.join(build_dir, f"{opts['name']}.so"))
            if fresh:  # a server's first start would otherwise sit silent for half a minute
                log.info("%s: building for sm_90a with nvcc (about 30 s, once; cached in %s)", KERNEL_NAME, build_dir)
            started = time.monotonic()
            try:
                with _exclusive_build(build_dir):
                    _extensions[phase_timers] = cpp_extension.load(**opts)
            except Exception as e:  # noqa: BLE001 - ninja / nvcc failures come as RuntimeError or OSError
                failure = _failures[build_dir] = BuildError(f"{KERNEL_NAME}: JIT build failed in {build_dir}: {e}")
                raise failure from e
            if fresh:
                log.info("%s: built in %.1f s", KERNEL_NAME, time.monotonic() - started)
    return _extensions[phase_timers]


def check_plan_inputs(cache_kind: str, page_size: int) -> None:
    if cache_kind not in CACHE_KINDS:
        raise ValueError(f"{KERNEL_NAME}: cache kind must be one of {CACHE_KINDS}, got {cache_kind!r}")
    if page_size not in PAGE_SIZES:
        raise ValueError(f"{KERNEL_NAME}: page_size must be one of {PAGE_SIZES}, got {page_size}")


def plan(workspace: torch.Tensor, query_start_loc, seq_lens, num_heads: int, *, page_size: int,
         softmax_scale: float, cache_kind: str = "bf16", num_splits: int | None = None,
         **_ignored) -> MLADecodePlan:
    """`plan_decode` with this kernel's layout: query tokens folded into 64-row tiles
    (row = token * H + head), 64-key tiles, splits filling one wave of one CTA per SM.
    `fold` / `tile` overrides of the Triton planner do not apply and are ignored."""
    check_plan_inputs(cache_kind, page_size)
    if workspace.data_ptr() % 16:  # its split partials are carved at 256-byte offsets and written 16 bytes at a time
        raise ValueError(f"{KERNEL_NAME}: the workspace must be 16-byte aligned")
    return plan_decode(workspace, query_start_loc, seq_lens, num_heads, page_size=page_size,
                       softmax_scale=softmax_scale, cache_kind=cache_kind, fold=True, num_splits=num_splits,
                       tile=TILE)


def num_splits_for(batch: int, max_q_len: int, max_kv_len: int, num_heads: int, num_sms: int) -> int:
    """The split count `plan` picks (for workspace sizing); the same for both cache kinds."""
    from .device import DeviceInfo

    return _layout(batch, max_q_len, max_kv_len, num_heads, DeviceInfo(9, num_sms), "bf16", True, TILE)[4]


def check_run_inputs(plan: MLADecodePlan, q: torch.Tensor, cache: MLACache, page_table: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor | None) -> None:
    T, H = plan.num_tokens, plan.num_heads
    if plan.tile != TILE or not plan.fold:
        raise ValueError(f"{KERNEL_NAME}: the plan was not made by lightspeed_mla.sm90.plan")
    if q.shape != (T, H, D_PACKED) or q.stride(-1) != 1 or q.dtype != torch.bfloat16:
        raise ValueError(f"{KERNEL_NAME}: q must be bf16 [{T}, {H}, {D_PACKED}] with unit last stride, "
                         f"got {q.dtype} {tuple(q.shape)}")
    if out.shape != (T, H, D_LATENT) or out.stride(-1) != 1 or out.dtype != torch.bfloat16:
        raise ValueError(f"{KERNEL_NAME}: out must be bf16 [{T}, {H}, {D_LATENT}], got {out.dtype} {tuple(out.shape)}")
    for name, t in (("q", q), ("out", out)):  # the kernel moves their rows in 16-byte pieces
        if t.data_ptr() % 16 or t.stride(0) % 8 or t.stride(1) % 8:
            raise ValueError(f"{KERNEL_NAME}: {name} must be 16-byte aligned with token and head strides a multiple "
                             f"of 8 elements, got strides {tuple(t.stride())}")
    if lse is not None and (lse.shape != (T, H) or not lse.is_contiguous() or lse.dtype != torch.float32):
        raise ValueError(f"{KERNEL_NAME}: lse must be contiguous fp32 [{T}, {H}]")
    if cache.kind != plan.cache_kind:
        raise ValueError(f"{KERNEL_NAME}: cache kind {cache.kind!r} differs from the plan's {plan.cache_kind!r}")
    if cache.kind == "bf16" and (cache.packed is None or cache.packed.dtype != torch.bfloat16):
        raise ValueError(f"{KERNEL_NAME}: a bf16 cache must be the packed bf16 tensor")
    if cache.kind == "fp8" and (cache.latent.dtype != torch.float8_e4m3fn or cache.rope.dtype != torch.bfloat16
                                or cache.scale is None or cache.scale.dtype != torch.float32):
        raise ValueError(f"{KERNEL_NAME}: an fp8 cache is e4m3 latent, bf16 rope and fp32 scales")
    if cache.page_size != plan.page_size:
        raise ValueError(f"{KERNEL_NAME}: cache page size {cache.page_size} differs from the plan's {plan.page_size}")
    if page_table.dim() != 2 or page_table.shape[0] < plan.batch_size or page_table.stride(-1) != 1 \
            or page_table.dtype != torch.int32:
        raise ValueError(f"{KERNEL_NAME}: page_table must be int32 [B, max_pages] with unit last stride")


def phase_timer_buffer(plan: MLADecodePlan) -> torch.Tensor:
    """Zeros for the timer build's stamps and counters, on the plan's device: int64 [batch * row_tiles *
    num_splits CTAs, len(PHASES) + len(COUNTERS)]: the PHASES' ns, then the COUNTERS' cycles; CTA = (request
    * row_tiles + row tile) * num_splits + split. A stamp left 0 was not reached."""
    ctas = plan.batch_size * plan.row_tiles * plan.num_splits
    return torch.zeros(ctas, len(PHASES) + len(COUNTERS), dtype=torch.int64, device=plan.seq_lens.device)


def launch(plan: MLADecodePlan, q: torch.Tensor, cache: MLACache, page_table: torch.Tensor, out: torch.Tensor,
           lse: torch.Tensor | None = None, *, fp8_scores: bool = False, fp8_pv: bool = False,
           phase_ns: torch.Tensor | None = None) -> None:
    """The CUDA kernel alone: out (and lse) when unsplit, else the plan's split partials, which
    `combine_splits` merges. Inputs as `run`, checked there. phase_ns (`phase_timer_buffer`): run the
    timer build and stamp into it."""
    ext = load_extension(phase_timers=phase_ns is not None)
    S, fp8 = plan.num_splits, cache.kind == "fp8"
    ext.decode(q, cache.latent if fp8 else cache.packed, cache.rope if fp8 else None, cache.scale if fp8 else None,
               page_table, plan.seq_lens, plan.query_start_loc, out,
               lse if S == 1 else None, plan.partial_out if S > 1 else None, plan.partial_lse if S > 1 else None,
               plan.batch_size, plan.row_tiles, S, plan.softmax_scale * LOG2E, bool(fp8_scores and fp8),
               bool(fp8_pv and fp8), phase_ns)


def run(plan: MLADecodePlan, q: torch.Tensor, cache: MLACache, page_table: torch.Tensor, out: torch.Tensor,
        lse: torch.Tensor | None = None, *, fp8_scores: bool = False, fp8_pv: bool = False,
        phase_ns: torch.Tensor | None = None) -> torch.Tensor:
    """One layer of a planned batch: the CUDA kernel, then the Triton combine when split. No
    allocation, no host sync (CUDA-graph capturable). Same tensors as `run_decode`. fp8_scores (FP8
    caches): S_latent on e4m3 MMAs with Q quantised per row, else bf16 MMAs on the widened latent;
    fp8_pv (with fp8_scores): P V on e4m3 MMAs too. phase_ns: measurement only (`launch`)."""
    check_run_inputs(plan, q, cache, page_table, out, lse)
    if fp8_pv and not fp8_scores:
        raise ValueError(f"{KERNEL_NAME}: fp8_pv (e4m3 P V) needs fp8_scores (e4m3 scores)")
    if plan.num_tokens == 0:
        return out
    launch(plan, q, cache, page_table, out, lse, fp8_scores=fp8_scores, fp8_pv=fp8_pv, phase_ns=phase_ns)
    if plan.num_splits > 1:
        combine_splits(plan, out, lse)
    return out


def mla_decode_sm90(q: torch.Tensor, cache: MLACache, page_table: torch.Tensor, seq_lens: torch.Tensor,
                    query_start_loc: torch.Tensor, softmax_scale: float, *, out: torch.Tensor | None = None,
                    return_lse: bool = False, num_splits: int | None = None, fp8_scores: bool = False,
                    fp8_pv: bool = False, **_ignored):
    """One-shot form (plans and runs; allocates: not for CUDA graphs). Returns out, or (out, lse)."""
    T, H = q.shape[0], q.shape[1]
    qsl, lens = _host_i32(query_start_loc), _host_i32(seq_lens)
    B = lens.shape[0]
    max_q = int(np.diff(qsl).max()) if B else 0
    splits = num_splits or num_splits_for(B, max_q, int(lens.max()) if B else 0, H, device_info(q.device).num_sms)
    ws = torch.empty(decode_workspace_bytes(B, T, H, splits), dtype=torch.uint8, device=q.device)
    p = plan(ws, qsl, lens, H, page_size=cache.page_size, softmax_scale=softmax_scale, cache_kind=cache.kind,
             num_splits=num_splits)
    out = out if out is not None else torch.empty(T, H, D_LATENT, dtype=q.dtype, device=q.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q.device) if return_lse else None
    run(p, q, cache, page_table.to(torch.int32), out, lse, fp8_scores=fp8_scores, fp8_pv=fp8_pv)
    return (out, lse) if return_lse else out


class Sm90DecodeOp:
    """`mla_decode_sm90` (or, fp8_scores, `mla_decode_sm90_fp8qk`; with fp8_pv too, `mla_decode_sm90_fp8mma`)
    as a registry impl: the one-shot call plus plan / run / workspace_bytes."""

    plan = staticmethod(plan)
    workspace_bytes = staticmethod(decode_workspace_bytes)

    def __init__(self, fp8_scores: bool = False, fp8_pv: bool = False):
        self.fp8_scores = fp8_scores
        self.fp8_pv = fp8_pv

    def run(self, plan, q, cache, page_table, out, lse=None):
        return run(plan, q, cache, page_table, out, lse, fp8_scores=self.fp8_scores, fp8_pv=self.fp8_pv)

    @staticmethod
    def prepare() -> None:
        """Build (or load the cached build of) the kernel now; BuildError when nvcc fails, so a caller
        can pick the next kernel before serving instead of failing at the first decode."""
        load_extension()

    def __call__(self, *args, **kwargs):
        return mla_decode_sm90(*args, fp8_scores=self.fp8_scores, fp8_pv=self.fp8_pv, **kwargs)


CAPABILITY = {"device_types": ("cuda",), "vendors": ("nvidia",), "min_compute_capability": (9, 0),
              "max_compute_capability": (9, 0)}


def register(registry=None) -> None:
    """Register `mla_decode_sm90` (both caches, PLUGIN + 1: above Triton, below FlashInfer's bf16 MLA) and
    `mla_decode_sm90_fp8qk` (FP8 caches, e4m3 scores, PORTABLE: opt-in for its accuracy) and
    `mla_decode_sm90_fp8mma` (FP8 caches, both products in e4m3, PORTABLE: opt-in for its accuracy); sm_90 only."""
    import lightspeed_kernel as lk

    for name, priority, kinds, fp8_scores, fp8_pv in (
            (KERNEL_NAME, lk.Priority.of(lk.Priority.PLUGIN, 1), CACHE_KINDS, False, False),
            (KERNEL_NAME_FP8_SCORES, lk.Priority.PORTABLE, ("fp8",), True, False),
            (KERNEL_NAME_FP8_MMA, lk.Priority.PORTABLE, ("fp8",), True, True)):
        features = tuple(f for f in FEATURES if f != "bf16_kv" or "bf16" in kinds)
        lk.register_kernel("mla", "decode", name=name, solution="cuda", priority=priority, capability=CAPABILITY,
                           dtypes=(torch.bfloat16,), features=features,
                           traits={"page_size": PAGE_SIZES, "kv_dtype": kinds}, tags=("latency", "throughput"),
                           registry=registry)(Sm90DecodeOp(fp8_scores, fp8_pv))


def discover(registry=None) -> tuple[bool, str | None]:
    """Register the kernel when it can be built here: (available, why not)."""
    ok, why = availability()
    if ok:
        register(registry)
    return ok, why
