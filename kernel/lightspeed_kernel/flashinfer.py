"""FlashInfer (`flashinfer-python`, optional extra `lightspeed-kernel[flashinfer]`) as a paged
attention backend: `attention/decode` and `attention/prefill`.

Import-guarded: without the `flashinfer` package nothing registers and nothing fails. Its import
takes seconds, pulls in hundreds of modules and initialises CUDA (it asks the device's compute
capability to name its JIT cache, unless FLASHINFER_CUDA_ARCH_LIST is set), so registration only
looks the package up (`importlib.util.find_spec`); the library is imported at the first call, and
a broken install raises there (an ImportError naming the kernel), never at `import lightspeed_kernel`.
Kernels JIT-compile with nvcc at their first use per configuration (dtypes, head dim, soft cap).

Correct on the H200 (the GPU tests of kernel/tests/test_flashinfer.py against the reference, with
flashinfer 0.7.2.post1 on torch 2.11 / CUDA 13: FA3 prefill, FA2 prefill, CUDA-core and tensor-core
decode, fp8 caches, soft cap, the graph-capture hand-on). Bands follow what the H200 measured:
* prefill, sm_90 only: PERFORMANT + 1, above our Triton kernel. Served A/B on the 8B-shaped model
  (bench/results/flashinfer_prefill_ab_2026-12-02_1410_h200/): agentic c = 4 first-turn TTFT mean
  1792 vs 2045 ms, output tokens/min 24,282 vs 20,955. Other architectures are unmeasured, so it is
  not a candidate there (no override either).
* decode: PORTABLE, below Triton (ours is faster at batch >= 16,
  bench/results/flashinfer_h200_2026-12-01_2221/); `LIGHTSPEED_KERNEL_OVERRIDE_ATTENTION_DECODE=flashinfer_paged_decode`.
A configuration's first call JIT-compiles it with nvcc (the GPU tests' configurations took 356 s
together on the H200; FlashInfer caches the builds on disk, so a machine pays once) and is logged.

What runs: prefill (and decode rows with several query tokens, i.e. speculative verification) goes
through `BatchPrefillWithPagedKVCacheWrapper` with `causal=True` (FlashInfer's causal mask is
bottom-right aligned, as ours) and `backend="auto"`, which is FA3 on sm_90 for fp16/bf16 with head
dim 64/128/256 and FA2 elsewhere (fp8 caches with a bf16 query are FA2: FA3 wants an fp8 query).
Single-token decode goes through `BatchDecodeWithPagedKVCacheWrapper`, on tensor cores when a KV
head serves more than 4 query heads. Layout "NHD" with K and V as separate tensors is exactly our
cache. fp8 caches are dequantised by FlashInfer as ours are (`sm_scale * k_scale`, output times
`v_scale`). Handed to the next kernel in line (Triton on a GPU, else the reference): fp32 queries,
head dims other than 64/128/256, k/v caches with different strides, `k_scale` / `v_scale` given as
tensors (FlashInfer folds them into a host float: reading one would sync per layer), and any call
under CUDA-graph capture (below).

Plan/run and what it costs. FlashInfer's `plan()` schedules on the host: it reads indptr and the
lengths there. The engine passes them as the op's `host_lengths` (its scheduler's plan), and the
CSR vectors are then built on the host (:func:`host_paged_kv_lengths`) with no read-back. Without
them, planning from our device metadata costs one device-to-host copy, which waits for the GPU
work queued before it (in the engine, the whole step still running ahead). The page table is converted on the device without a sync
(:func:`paged_kv_metadata`), the small vectors come back in one copy, and the planned wrapper is
cached per problem configuration together with the identity of the metadata tensors it was
planned for (address, shape, strides and torch's version counter; the tensors are held, so their
memory is not reused under a stale plan). Every later layer of the step with the same metadata
runs with no plan and no sync: one sync per step, on the first attention layer. A caller that
rewrites metadata in place outside torch's in-place ops (a custom kernel) does not bump the
version counter and must pass fresh tensors. CUDA graphs: our decode contract lets one capture
serve every later `seq_lens` without a host step, and FlashInfer's plan cannot (its split
schedule is fixed on the host per batch), so under capture these kernels hand on to Triton.

Sampling is not registered. Our `sampling/sample` draws the Gumbel-max token with
`u = hash(seed, offset, token)`: a seed reproduces the same token bit for bit on every device and
at every batch position, with min-p/top-k/top-p cut by value with ties kept. FlashInfer's
top-k/top-p sampling is rejection sampling over Philox streams keyed by the output row
(`curand_init(seed, row, offset)` in `sampling.cuh`): a different draw for the same seed, one that
changes with the row's batch position. Registering it would break that contract.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from .attention_adapters import metadata_identity, next_attention_kernel
from .registry import Priority, register_kernel

log = logging.getLogger(__name__)

DECODE_KERNEL = "flashinfer_paged_decode"
PREFILL_KERNEL = "flashinfer_paged_prefill"
LIBRARY = "flashinfer"
WORKSPACE_BYTES = 256 << 20  # FlashInfer's split-KV scratch, one per device, shared by the wrappers
HEAD_DIMS = (64, 128, 256)  # instantiated by both FA2 and FA3
Q_DTYPES = (torch.float16, torch.bfloat16)
FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MAX_DECODE_GROUP_ON_CUDA_CORES = 4  # wider GQA groups decode on tensor cores (as vLLM chooses)
MAX_CONFIGS = 32  # planned wrappers kept (configurations: heads, dtypes, scale, soft cap, kind)
_REQUIRED = ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper")
NOT_INSTALLED = f"{LIBRARY} unavailable: not installed (pip install 'lightspeed-kernel[flashinfer]')"


class PagedKVMetadata(NamedTuple):
    """FlashInfer's CSR form of a page table."""

    indptr: torch.Tensor  # int32 [B+1]: request b owns indices[indptr[b]:indptr[b+1]]
    indices: torch.Tensor  # int32 [B*P]: page ids, request after request; entries past indptr[-1] are 0
    last_page_len: torch.Tensor  # int32 [B]: tokens in each request's last page (1..page_size; 0 if empty)


def paged_kv_metadata(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int) -> PagedKVMetadata:
    """Our page_table int32 [B, P] and seq_lens int32 [B] -> FlashInfer's indptr / indices /
    last_page_len, on their device, vectorised and without a host sync (so `indices` keeps the
    padded length B*P instead of the exact total). A request claiming more than P pages is cut to
    P, so the result never points past the table."""
    batch, width = page_table.shape
    device = page_table.device
    num_pages = torch.clamp((seq_lens.long() + page_size - 1) // page_size, max=width)  # [B]
    indptr = torch.zeros(batch + 1, dtype=torch.int64, device=device)
    torch.cumsum(num_pages, 0, out=indptr[1:])
    cols = torch.arange(width, device=device)
    live = cols[None, :] < num_pages[:, None]  # [B, P]
    spill = batch * width  # one slot past the end takes every dead entry
    dest = torch.where(live, indptr[:-1, None] + cols[None, :], spill)
    indices = torch.zeros(spill + 1, dtype=torch.int32, device=device)
    indices.scatter_(0, dest.reshape(-1), page_table.reshape(-1).to(torch.int32))
    last = (seq_lens.long() - (num_pages - 1) * page_size).clamp(0, page_size)
    last = torch.where(num_pages > 0, last, 0)
    return PagedKVMetadata(indptr.to(torch.int32), indices[:spill], last.to(torch.int32))


def host_paged_kv_lengths(host_lengths, page_size: int, width: int) -> tuple[torch.Tensor, ...]:
    """What `plan()` reads on the host, from host lengths (the same values `paged_kv_metadata` gives
    on the device): int32 CPU tensors qo_indptr [B+1], kv_indptr [B+1], last_page_len [B], seq_lens [B]."""
    qsl = np.asarray(host_lengths.query_start_loc, dtype=np.int64)
    lens = np.asarray(host_lengths.seq_lens, dtype=np.int64)
    num_pages = np.minimum((lens + page_size - 1) // page_size, width)
    kv_indptr = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(num_pages, out=kv_indptr[1:])
    last = np.where(num_pages > 0, np.clip(lens - (num_pages - 1) * page_size, 0, page_size), 0)
    return tuple(torch.from_numpy(a.astype(np.int32)) for a in (qsl, kv_indptr, last, lens))


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def unsupported_reason(q, k_cache, v_cache, k_scale, v_scale, out) -> str | None:
    """Why FlashInfer's paged kernels cannot take this call (None when they can)."""
    if q.dtype not in Q_DTYPES:
        return f"q dtype {q.dtype}"
    if k_cache.dtype != v_cache.dtype or (k_cache.dtype != q.dtype and k_cache.dtype not in FP8_KV_DTYPES):
        return f"cache dtypes {k_cache.dtype}/{v_cache.dtype} with q {q.dtype}"
    if q.dim() != 3 or k_cache.dim() != 4 or q.shape[2] not in HEAD_DIMS or k_cache.shape[3] != q.shape[2]:
        return f"shapes q {list(q.shape)} cache {list(k_cache.shape)}"
    if q.shape[1] % k_cache.shape[2]:
        return "query heads not a multiple of kv heads"
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or q.stride(-1) != 1:
        return "k/v caches with different strides or strided last dims"
    if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):
        return "tensor k_scale/v_scale (FlashInfer folds scales into host floats)"
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        return "out is not a [T, Hq, D] tensor of q's dtype"
    if _capturing(q.device):
        return "CUDA-graph capture (plan() runs on the host)"
    return None


class _Planned:
    """A wrapper with the metadata it was planned for (held: their addresses stay theirs)."""

    __slots__ = ("wrapper", "key", "held")

    def __init__(self, wrapper):
        self.wrapper, self.key, self.held = wrapper, None, ()


class FlashInferPaged:
    """Plans and runs FlashInfer's paged attention for one library module (see the module notes).

    `decode` / `prefill` take the op's arguments and return the output, or None when FlashInfer
    cannot take the call (the caller hands it on). `prefill_backend` is FlashInfer's ("auto",
    "fa2", "fa3"); `decode_tensor_cores` None = by GQA group size.
    """

    def __init__(self, lib, *, prefill_backend: str = "auto", decode_tensor_cores: bool | None = None):
        self.lib = lib
        self.prefill_backend = prefill_backend
        self.decode_tensor_cores = decode_tensor_cores
        self._seen: set[tuple] = set()  # configurations planned at least once (logged: the JIT)
        self.plans = 0  # plan() calls so far (one per step and configuration when caching works)
        self.host_reads = 0  # plans that read lengths back from the device (none when given host_lengths)
        self._workspaces: dict[torch.device, torch.Tensor] = {}
        self._planned: dict[tuple, _Planned] = {}
        self._lock = threading.Lock()

    def workspace(self, device: torch.device) -> torch.Tensor:
        if device not in self._workspaces:
            self._workspaces[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspaces[device]

    def decode(self, *args, **kw):
        """attention/decode (the op's arguments); single-token rows (T == B) on the decode wrapper,
        rows with several query tokens as a causal prefill. None when FlashInfer cannot take it."""
        launch = self.prepare("decode", *args, **kw)
        return None if launch is None else launch()

    def prefill(self, *args, **kw):
        """attention/prefill (causal, bottom-right aligned; ragged query lengths), or None."""
        launch = self.prepare("prefill", *args, **kw)
        return None if launch is None else launch()

    def prepare(self, mode, q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *, max_query_len, scale,
                soft_cap=None, k_scale=None, v_scale=None, out=None,
                host_lengths=None) -> Callable[[], torch.Tensor] | None:
        """Plan (when these metadata are new) and return a call that only runs the planned kernel into
        `out` (no allocation, no plan, no sync: CUDA-graph capturable for as long as the metadata hold
        the values planned for, which is the caller's promise: benchmarks, fixed shapes). None when
        FlashInfer cannot take the call."""
        if unsupported_reason(q, k_cache, v_cache, k_scale, v_scale, out) is not None:
            return None
        out = torch.empty_like(q) if out is None else out
        if q.shape[0] == 0 or seq_lens.shape[0] == 0:
            return lambda: out
        kind, variant = "prefill", self.prefill_backend
        if mode == "decode" and int(max_query_len) <= 1 and q.shape[0] == seq_lens.shape[0]:
            group = q.shape[1] // k_cache.shape[2]
            cores = self.decode_tensor_cores
            kind, variant = "decode", group > MAX_DECODE_GROUP_ON_CUDA_CORES if cores is None else cores
        wrapper = self._planned_wrapper(kind, variant, q, k_cache, page_table, query_start_loc, seq_lens, scale,
                                        soft_cap, host_lengths)
        scales = {"k_scale": None if k_scale is None else float(k_scale),
                  "v_scale": None if v_scale is None else float(v_scale)}

        def launch() -> torch.Tensor:
            result = wrapper.run(q, (k_cache, v_cache), out=out, **scales)
            if result is not out:  # FlashInfer returns `out` itself; a copy only if a version does not
                out.copy_(result)
            return out

        return launch

    def _planned_wrapper(self, kind, variant, q, k_cache, page_table, query_start_loc, seq_lens, scale, soft_cap,
                         host_lengths=None):
        # q: [T, Hq, D]; caches: [num_pages, page_size, Hkv, D]; page_table: [B, P] int32
        cap = float(soft_cap) if soft_cap is not None and soft_cap > 0 else 0.0
        config = (kind, variant, q.device, q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1],
                  q.dtype, k_cache.dtype, float(scale), cap)
        metadata = (page_table, query_start_loc, seq_lens)
        with self._lock:
            planned = self._planned.get(config)
            if planned is None:
                if len(self._planned) >= MAX_CONFIGS:
                    self._planned.pop(next(iter(self._planned)))
                planned = self._planned[config] = _Planned(self._wrapper(kind, variant, q.device))
                if config not in self._seen:  # the first call of a configuration JIT-compiles it
                    self._seen.add(config)
                    log.info("FlashInfer %s (%s): heads %d/%d, head dim %d, page %d, %s: first use, may "
                             "JIT-compile with nvcc (FlashInfer caches the build on disk)", kind, variant,
                             q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], q.dtype)
            key = tuple(metadata_identity(t) for t in metadata)
            if planned.key != key:
                self._plan(planned.wrapper, kind, q, k_cache, *metadata, float(scale), cap, host_lengths)
                planned.key, planned.held = key, metadata
                self.plans += 1
            return planned.wrapper

    def _wrapper(self, kind: str, variant, device: torch.device):
        workspace = self.workspace(device)
        if kind == "decode":
            return self.lib.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=bool(variant))
        return self.lib.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=variant)

    def _plan(self, wrapper, kind, q, k_cache, page_table, query_start_loc, seq_lens, scale, cap, host_lengths):
        page_size = k_cache.shape[1]
        meta = paged_kv_metadata(page_table, seq_lens, page_size)
        batch = seq_lens.shape[0]
        if host_lengths is not None:  # the engine's plan: the same CSR on the host, no read-back
            qo_indptr, kv_indptr, last_page_len, kv_lens = host_paged_kv_lengths(
                host_lengths, page_size, page_table.shape[1])
        else:
            # the one host sync of a step: qo indptr, kv indptr, last-page lengths, seq_lens, together
            host = torch.cat([query_start_loc.to(torch.int32), meta.indptr, meta.last_page_len,
                              seq_lens.to(torch.int32)]).cpu()
            self.host_reads += 1
            qo_indptr, kv_indptr = host[: batch + 1], host[batch + 1 : 2 * batch + 2]
            last_page_len, kv_lens = host[2 * batch + 2 : 3 * batch + 2], host[3 * batch + 2 :]
        common = dict(logits_soft_cap=cap, sm_scale=scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype,
                      o_data_type=q.dtype, seq_lens=kv_lens, non_blocking=True)
        heads = (q.shape[1], k_cache.shape[2], q.shape[2], page_size)
        if kind == "decode":
            wrapper.plan(kv_indptr, meta.indices, last_page_len, *heads, **common)
        else:
            wrapper.plan(qo_indptr, kv_indptr, meta.indices, last_page_len, *heads, causal=True, **common)


def load_library():
    """Import FlashInfer and check it has the wrappers this adapter drives."""
    lib = importlib.import_module(LIBRARY)
    missing = [name for name in _REQUIRED if not hasattr(lib, name)]
    if missing:
        raise ImportError(f"{LIBRARY} {getattr(lib, '__version__', '?')} lacks {', '.join(missing)}")
    return lib


class LazyLibrary:
    """`make(load())`, built at the first `get()` (thread-safe): FlashInfer's import takes seconds
    and starts CUDA, so adapters (this one, lightspeed_mla's) load it only when a kernel runs. An
    import-time failure becomes an ImportError naming `who`."""

    def __init__(self, load: Callable[[], object], make: Callable[[object], object], who: str):
        self._load, self._make, self._who = load, make, who
        self._value = None
        self._lock = threading.Lock()

    def get(self):
        if self._value is None:
            with self._lock:
                if self._value is None:
                    try:
                        lib = self._load()
                    except Exception as e:  # noqa: BLE001 - any import-time failure of the library
                        raise ImportError(f"{self._who}: {LIBRARY} is installed but does not load: "
                                          f"{type(e).__name__}: {e}") from e
                    self._value = self._make(lib)
        return self._value


_SPEC = dict(solution="flashinfer", priority=Priority.PORTABLE, dtypes=Q_DTYPES,
             capability={"vendors": ("nvidia",), "min_compute_capability": (8, 0)},
             features=("fp8_kv", "soft_cap", "gqa"), tags=("flashinfer",))
# FA3 prefill measured faster than our Triton kernel on the H200 served (module note): above it, sm_90 only.
_PREFILL_SPEC = dict(_SPEC, priority=Priority.PERFORMANT + 1,
                     capability={"vendors": ("nvidia",), "min_compute_capability": (9, 0),
                                 "max_compute_capability": (9, 0)})


def register(load: Callable[[], object] = load_library, registry=None, **options) -> LazyLibrary:
    """Register `flashinfer_paged_decode` and `flashinfer_paged_prefill`; `load()` returns the
    library at the first call; `options` go to :class:`FlashInferPaged`. Returns the lazy holder
    (its `get()` gives the planner)."""
    lazy = LazyLibrary(load, lambda lib: FlashInferPaged(lib, **options), f"{DECODE_KERNEL}/{PREFILL_KERNEL}")

    @register_kernel("attention", "decode", name=DECODE_KERNEL, registry=registry, **_SPEC)
    def flashinfer_paged_decode(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *, max_query_len,
                                scale, soft_cap=None, k_scale=None, v_scale=None, out=None, host_lengths=None):
        """Paged decode (1..16 query tokens per request) through FlashInfer."""
        args = (q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
        kw = dict(max_query_len=max_query_len, scale=scale, soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale,
                  out=out, host_lengths=host_lengths)
        got = lazy.get().decode(*args, **kw)
        return got if got is not None else next_attention_kernel("decode", *args, **kw)

    @register_kernel("attention", "prefill", name=PREFILL_KERNEL, registry=registry, **_PREFILL_SPEC)
    def flashinfer_paged_prefill(q, k_cache, v_cache, page_table, query_start_loc, seq_lens, *, max_query_len,
                                 scale, soft_cap=None, k_scale=None, v_scale=None, out=None, host_lengths=None):
        """Paged causal prefill over a cached prefix through FlashInfer (FA3 on sm_90)."""
        args = (q, k_cache, v_cache, page_table, query_start_loc, seq_lens)
        kw = dict(max_query_len=max_query_len, scale=scale, soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale,
                  out=out, host_lengths=host_lengths)
        got = lazy.get().prefill(*args, **kw)
        return got if got is not None else next_attention_kernel("prefill", *args, **kw)

    return lazy


def discover(registry=None) -> tuple[bool, str | None]:
    """Register the kernels when the library is installed: (available, why not)."""
    try:
        found = importlib.util.find_spec(LIBRARY) is not None
    except (ImportError, ValueError) as e:  # a stub in sys.modules without a spec, a broken parent
        return False, f"{LIBRARY} unavailable: {type(e).__name__}: {e}"
    if not found:
        return False, NOT_INSTALLED
    register(registry=registry)
    return True, None


AVAILABLE, IMPORT_ERROR = discover()

__all__ = [
    "AVAILABLE",
    "DECODE_KERNEL",
    "IMPORT_ERROR",
    "NOT_INSTALLED",
    "PREFILL_KERNEL",
    "FlashInferPaged",
    "PagedKVMetadata",
    "discover",
    "host_paged_kv_lengths",
    "load_library",
    "paged_kv_metadata",
    "register",
    "unsupported_reason",
]
