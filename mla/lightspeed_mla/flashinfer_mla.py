"""FlashInfer's MLA decode (`flashinfer.mla.BatchMLAPagedAttentionWrapper`, flashinfer-python 0.7.2.post1,
optional extra `lightspeed-mla[flashinfer]`) as kernel `mla_decode_flashinfer` of `mla/decode`.

Import-guarded: without the `flashinfer` package nothing registers and nothing fails. Registration only
looks the package up; the library is imported at the first call (its import takes seconds), and a
broken install raises there, as an ImportError naming the kernel.

What FlashInfer's MLA takes (read in flashinfer/mla/_batch_mla/: _wrapper.py `plan` / `run`,
_planning.py `_validate_csr_metadata`, _backends/_fa_common.py `_validate_generated_fa_plan` /
`_run_generated_fa`; data/csrc/batch_mla_sm90_run.cu; data/include/flashinfer/attention/mla_hopper.cuh
`repack_fp8_kv_to_bf16` and the causal mask; scheduler.cuh `MLAPlan`):
- Absorbed queries [T, H, 512 + 64] and a paged cache ckv [pages, page_size, 512] + kpe
  [pages, page_size, 64], each read through its page and token strides. Our bf16 cache's `latent` and
  `rope` views of the packed [pages, page_size, 576] tensor are exactly that: no copy. The query goes in
  as our packed q.
- CSR metadata: qo_indptr, kv_indptr (page counts must equal ceil(kv_len / page_size)), kv_indices,
  kv_len; any page size; any number of query tokens per request; causal masking bottom-right aligned
  as ours (key k is hidden from query i when k + q_len > kv_len + i). LSE in base 2 or e.
- FP8 (SM90, bf16 queries): ckv AND kpe in e4m3, ckv scaled per tensor or per (token, 128-column group)
  (`ckv_scale_arr` [pages, page_size, 4] fp32), kpe by one per-tensor float. Our FP8 cache keeps the
  rope in bf16 and one latent scale per token: FlashInfer cannot read it, so FP8 calls go to the next
  kernel. `fp8_format_copy` builds FlashInfer's format from it (a copy, lossy in the rope) for benchmarks.
- plan() runs on the host: it reads qo_indptr / kv_indptr / kv_len there, schedules the work into a
  pinned buffer and copies it to the device without a sync; it keeps kv_indices, which run() reads on
  the device. FlashInfer's CUDA-graph mode replays a run only for the lengths of its last host plan.

Our decode contract is planned once from shapes, the true lengths read on the device at run, so one
captured graph serves every later step. FlashInfer's plan cannot do that; the registry impl
(`flashinfer_graph.FlashInferDecodeOp`) gives its plans a host side instead, re-planned once a step
(before each replay inside the engine's CUDA graphs) into buffers reserved in FlashInfer's CUDA-graph
mode: see flashinfer_graph.py. Its one-shot call (`FlashInferMLA.decode`) plans once per step (one
device-to-host copy of the lengths when they live on the device) and every later layer with the same
metadata tensors (address, shape, strides and torch's version counter; held, so their memory is not
reused under a stale plan) runs with no plan and no sync; a one-shot call under CUDA-graph capture
raises. Calls FlashInfer cannot take (FP8 caches, other dtypes, head counts that do not tile FlashInfer's
64-row query tiles, misaligned strides) go to our Triton kernel on a GPU with Triton, else to the reference.

Registered at PLUGIN + 1 on sm_90 for bf16 caches, above our Triton kernel: faster there at every point
the H200 measured (mla/NOTES.md, "FlashInfer's MLA"); not a candidate on other architectures.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from .cache import D_LATENT, D_PACKED, D_ROPE, FP8_MAX, MLACache
from .decode import _host_i32

LIBRARY = "flashinfer"
KERNEL_NAME = "mla_decode_flashinfer"
NOT_INSTALLED = f"{LIBRARY} unavailable: not installed (pip install 'lightspeed-mla[flashinfer]')"
WORKSPACE_BYTES = 128 << 20  # FlashInfer's float workspace (split partials), one per device
MAX_WORK_ITEMS = 16384  # MLAPlan's fixed work-list capacity (scheduler.cuh)
QUERY_TILE = 64  # rows of (query token, head) per FlashInfer CTA; two CTAs a cluster past 64 a request
FP8_GROUP = 128  # latent columns per scale in FlashInfer's per-token FP8 scales
MAX_CONFIGS = 16  # planned wrappers kept by the one-shot op
FEATURES = ("paged", "bf16_kv", "lse", "spec_decode", "causal", "ragged")


class MLACSR(NamedTuple):
    """A batch in FlashInfer's CSR form (what `BatchMLAPagedAttentionWrapper.plan` takes)."""

    qo_indptr: torch.Tensor  # int32 [B+1], host: request b's query rows are qo_indptr[b]:qo_indptr[b+1]
    kv_indptr: torch.Tensor  # int32 [B+1], host: request b's pages are kv_indices[kv_indptr[b]:kv_indptr[b+1]]
    kv_len: torch.Tensor  # int32 [B], host: keys per request, its new tokens included
    kv_indices: torch.Tensor  # int32 [B*P], on the page table's device; entries past kv_indptr[-1] are 0


def host_lengths(query_start_loc, seq_lens, page_size: int, max_pages: int):
    """(qo_indptr, kv_indptr, kv_len) as host int32 tensors from host lengths (numpy / CPU tensor / list),
    checked as `plan_decode` checks them, and no request may need more than `max_pages` pages."""
    qsl, lens = _host_i32(query_start_loc), _host_i32(seq_lens)
    batch = lens.shape[0]
    if qsl.shape != (batch + 1,) or qsl[0] != 0 or np.any(np.diff(qsl) < 0):
        raise ValueError("flashinfer_mla: query_start_loc must be [B+1], start at 0 and not decrease")
    if np.any(np.diff(qsl) > lens):
        raise ValueError("flashinfer_mla: a request has more query tokens than keys")
    pages = -(-lens.astype(np.int64) // page_size)
    if np.any(pages > max_pages):
        raise ValueError(f"flashinfer_mla: a request needs more pages than the page table's {max_pages}")
    kv_indptr = np.zeros(batch + 1, dtype=np.int32)
    np.cumsum(pages, out=kv_indptr[1:])
    return torch.from_numpy(qsl.copy()), torch.from_numpy(kv_indptr), torch.from_numpy(lens.copy())


def kv_indices(page_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Our page table [B, P] -> FlashInfer's kv_indices [B*P] int32: request after request, its
    ceil(seq_len / page_size) pages (cut at P), zeros after. On the page table's device, vectorised,
    no host sync (seq_lens may live anywhere: a host tensor is copied without waiting, never read)."""
    batch, width = page_table.shape
    device = page_table.device
    out = torch.empty(batch * width, dtype=torch.int32, device=device) if out is None else out
    if batch == 0 or width == 0:
        return out.zero_()
    lens = seq_lens.to(torch.int64).to(device, non_blocking=True)
    pages = ((lens + page_size - 1) // page_size).clamp_(0, width)  # [B]
    ends = torch.cumsum(pages, 0)  # [B]: one past each request's last entry
    slot = torch.arange(batch * width, device=device)
    row = torch.searchsorted(ends, slot, right=True)  # the request owning each entry; B past the end
    live = row < batch
    row = row.clamp_(max=batch - 1)
    col = (slot - ends[row] + pages[row]).clamp_(0, width - 1)
    return out.copy_(page_table[row, col]).masked_fill_(~live, 0)


def csr_metadata(page_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                 page_size: int) -> MLACSR:
    """Our metadata -> FlashInfer's CSR. The lengths come to the host in one copy (a sync when they
    live on the device); kv_indices is built on the page table's device."""
    lengths = torch.cat([query_start_loc.to(torch.int32).reshape(-1), seq_lens.to(torch.int32).reshape(-1)])
    host = lengths.cpu() if lengths.device.type != "cpu" else lengths
    batch = seq_lens.shape[0]
    qo, kv_indptr, kv_len = host_lengths(host[: batch + 1], host[batch + 1:], page_size, page_table.shape[1])
    return MLACSR(qo, kv_indptr, kv_len, kv_indices(page_table[:batch], seq_lens, page_size))


class FlashInferFP8Cache(NamedTuple):
    """An FP8 cache in FlashInfer's FP8 MLA format (made by :func:`fp8_format_copy`)."""

    ckv: torch.Tensor  # e4m3 [pages, page_size, 512]
    kpe: torch.Tensor  # e4m3 [pages, page_size, 64]
    ckv_scale: torch.Tensor  # fp32 [pages, page_size, 4]: one scale per token and 128-column group
    kpe_scale: float  # one scale for every rope value

    @property
    def page_size(self) -> int:
        return self.ckv.shape[1]

    def dequantized(self) -> MLACache:
        """What FlashInfer computes with, as an fp32 unquantised MLACache (for the reference)."""
        groups = self.ckv.float().unflatten(-1, (-1, FP8_GROUP)) * self.ckv_scale[..., None]
        return MLACache("bf16", groups.flatten(-2), self.kpe.float() * self.kpe_scale)


def fp8_format_copy(cache: MLACache) -> FlashInferFP8Cache:
    """Our FP8 cache in FlashInfer's format, for benchmarks: the e4m3 latent shared, its per-token scale
    repeated for the four column groups, the bf16 rope quantised to e4m3 with one per-tensor scale
    (amax / 448; lossy, and the amax is read on the host). Serving would have to keep such a copy in
    step with every store, so the registered kernel does not take FP8 caches."""
    if cache.kind != "fp8":
        raise ValueError("fp8_format_copy: needs an fp8 cache")
    kpe_scale = max(cache.rope.abs().amax().float().item(), 1e-12) / FP8_MAX
    kpe = (cache.rope.float() / kpe_scale).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    ckv_scale = cache.scale.float().expand(*cache.scale.shape[:2], D_LATENT // FP8_GROUP).contiguous()
    return FlashInferFP8Cache(cache.latent, kpe, ckv_scale, kpe_scale)


def _aligned(t: torch.Tensor) -> bool:
    # FlashInfer loads rows in 16-byte chunks: unit last stride, 8-element strides, 16-byte base.
    return t.stride(-1) == 1 and all(s % 8 == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def unsupported_reason(q, cache, page_table, out=None) -> str | None:
    """Why the registered kernel cannot take this call (None when it can)."""
    if q.dtype != torch.bfloat16 or q.dim() != 3 or q.shape[2] != D_PACKED:
        return f"q must be bf16 [T, H, {D_PACKED}], got {q.dtype} {list(q.shape)}"
    if cache.kind != "bf16" or cache.latent.dtype != q.dtype:
        return ("FlashInfer's FP8 MLA wants an e4m3 rope with one per-tensor scale; our FP8 cache keeps it "
                "in bf16" if cache.kind == "fp8" else f"cache dtype {cache.latent.dtype}")
    heads = q.shape[1]
    if (2 * QUERY_TILE) % heads:
        return f"{heads} heads do not divide FlashInfer's {2 * QUERY_TILE}-row query tiles"
    if not all(_aligned(t) for t in (q, cache.latent, cache.rope)):
        return "q or cache strides not 16-byte aligned"
    if page_table.dim() != 2 or page_table.dtype not in (torch.int32, torch.int64):
        return "page_table must be an int32 [B, P] tensor"
    if out is not None and (out.shape != (q.shape[0], heads, D_LATENT) or out.dtype != q.dtype or not _aligned(out)):
        return "out must be an aligned bf16 [T, H, 512] tensor"
    return None


def schedule_refusal(q_lens: np.ndarray, num_heads: int, device: torch.device) -> str | None:
    """Why FlashInfer's planner (MLAPlan, scheduler.cuh) would refuse a batch of these query lengths: a
    query tile (64 rows, 128 when requests average more than 64) that ends inside a token's heads, or more
    work items than its fixed list holds. None when it takes it. Only the query lengths count, so a
    batch layout it takes once it takes for any KV lengths."""
    rows = np.asarray(q_lens, dtype=np.int64) * num_heads
    if rows.size == 0:
        return None
    tile = 2 * QUERY_TILE if int(rows.sum()) // rows.size > QUERY_TILE else QUERY_TILE
    if tile % num_heads:
        return f"{num_heads} heads end inside FlashInfer's {tile}-row query tile"
    tiles = int(((rows + tile - 1) // tile).sum())
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
    if tiles + num_sms > MAX_WORK_ITEMS:  # KV splits add at most one item a cluster (<= one an SM)
        return f"{tiles} query tiles exceed FlashInfer's {MAX_WORK_ITEMS} work items"
    return None


def _pinned(t: torch.Tensor) -> torch.Tensor:
    # Fresh from torch's caching host allocator: it holds the block until the copy reading it has run.
    return t.pin_memory()


class FlashInferUnsupported(ValueError):
    """FlashInfer's planner would refuse this batch (the caller hands it on)."""


@dataclass(frozen=True)
class FlashInferMLAPlan:
    """A planned batch: the wrapper and the metadata it reads at run (held)."""

    wrapper: object | None  # None for an empty batch
    backend: str  # FlashInfer's backend: "fa3" (sm_90) or "fa2"
    num_tokens: int
    num_heads: int
    page_size: int
    kv_dtype: torch.dtype
    with_lse: bool
    csr: MLACSR


class FlashInferMLA:
    """Plans and runs FlashInfer's MLA for one `flashinfer.mla` module (see the module notes).

    backend: FlashInfer's ("fa3", "fa2"); None = fa3 on compute capability 9.x, else fa2.
    """

    def __init__(self, lib, *, backend: str | None = None):
        self.lib, self.backend = lib, backend
        self.plans = 0  # host plans so far (one per step and configuration when caching works)
        self._workspaces: dict[torch.device, torch.Tensor] = {}
        self._fences: dict[torch.device, torch.Tensor] = {}
        self._planned: dict[tuple, tuple] = {}
        self._lock = threading.Lock()

    def backend_for(self, device: torch.device) -> str:
        if self.backend is not None:
            return self.backend
        hopper = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9
        return "fa3" if hopper else "fa2"

    def workspace(self, device: torch.device) -> torch.Tensor:
        if device not in self._workspaces:
            self._workspaces[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspaces[device]

    def plan(self, query_start_loc, seq_lens, page_table: torch.Tensor, num_heads: int, *, page_size: int,
             softmax_scale: float, q_dtype: torch.dtype = torch.bfloat16, kv_dtype: torch.dtype | None = None,
             with_lse: bool = False) -> FlashInferMLAPlan:
        """Plan one batch on the host (lengths host-side for no sync; page_table [B, P] on the device).
        kv_dtype: the cache's (q_dtype, or float8_e4m3fn for a :class:`FlashInferFP8Cache`)."""
        csr = csr_metadata(page_table, torch.as_tensor(seq_lens), torch.as_tensor(query_start_loc), page_size)
        kv_dtype = q_dtype if kv_dtype is None else kv_dtype
        device, tokens = page_table.device, int(csr.qo_indptr[-1])
        backend, wrapper = self.backend_for(device), None
        if tokens:
            self._check_schedule(csr, num_heads, device)
            wrapper = self.lib.BatchMLAPagedAttentionWrapper(self.workspace(device), backend=backend)
            self.plan_into(wrapper, csr, num_heads, page_size=page_size, softmax_scale=softmax_scale,
                           q_dtype=q_dtype, kv_dtype=kv_dtype, with_lse=with_lse)
        return FlashInferMLAPlan(wrapper, backend, tokens, num_heads, page_size, kv_dtype, with_lse, csr)

    def plan_into(self, wrapper, csr: MLACSR, num_heads: int, *, page_size: int, softmax_scale: float,
                  q_dtype: torch.dtype = torch.bfloat16, kv_dtype: torch.dtype | None = None,
                  with_lse: bool = False) -> None:
        """One host plan of `wrapper` for a batch in CSR form (its lengths on the host, kv_indices on the
        device). On a GPU the host vectors go through fresh pinned memory (a pageable copy would wait for
        the work queued ahead), and FlashInfer's own pinned staging buffer is fenced (below)."""
        device = csr.kv_indices.device
        qo_indptr, kv_indptr, kv_len = (_pinned(t) if device.type == "cuda" else t
                                        for t in (csr.qo_indptr, csr.kv_indptr, csr.kv_len))
        metadata = self.lib.MLAPlanMetadata.csr(qo_indptr, kv_indptr, csr.kv_indices, kv_len)
        wrapper.plan(metadata=metadata,
                     num_heads=num_heads, head_dim_ckv=D_LATENT, head_dim_kpe=D_ROPE, page_size=page_size,
                     causal=True, sm_scale=float(softmax_scale), q_data_type=q_dtype,
                     kv_data_type=q_dtype if kv_dtype is None else kv_dtype,
                     query_layout="packed", kv_cache_layout="split", lse_mode="basee" if with_lse else "none")
        self._fence_staging(wrapper, device)
        self.plans += 1

    def _fence_staging(self, wrapper, device: torch.device) -> None:
        """Keep FlashInfer's pinned schedule buffer from being recycled before the GPU has read it.

        Each plan stages its schedule in a pinned buffer it takes from torch's caching host allocator and
        copies it with a raw cudaMemcpyAsync, which torch does not see: when the plan is replaced, the buffer
        goes back to the allocator as free at once, and a later plan of the same step (another wrapper, a
        drafter's layers) may refill it before the copy of a step still queued on the GPU has run. A one-byte
        torch copy from it, queued after FlashInfer's, makes the allocator hold the buffer until the stream
        passes that point. The buffer is the wrapper's `_pin_memory_int_workspace_buffer` (0.7.2's mirror
        of the backend's); without it nothing is fenced."""
        staged = getattr(wrapper, "_pin_memory_int_workspace_buffer", None)
        if device.type != "cuda" or not isinstance(staged, torch.Tensor) or not staged.is_pinned():
            return
        if device not in self._fences:
            self._fences[device] = torch.empty(1, dtype=staged.dtype, device=device)
        self._fences[device].copy_(staged[:1], non_blocking=True)

    @staticmethod
    def _check_schedule(csr: MLACSR, num_heads: int, device: torch.device) -> None:
        why = schedule_refusal((csr.qo_indptr[1:] - csr.qo_indptr[:-1]).numpy(), num_heads, device)
        if why is not None:
            raise FlashInferUnsupported(why)

    def run(self, plan: FlashInferMLAPlan, q: torch.Tensor, cache: MLACache | FlashInferFP8Cache,
            out: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
        """Run a planned batch into out [T, H, 512] (and lse [T, H] fp32, natural log, when planned
        with_lse). No allocation, no plan: CUDA-graph capturable while the planned lengths hold."""
        if q.shape[:2] != (plan.num_tokens, plan.num_heads) or (lse is not None) != plan.with_lse:
            raise ValueError("flashinfer_mla.run: q or lse differ from the plan")
        if isinstance(cache, FlashInferFP8Cache):
            kv, scales = (cache.ckv, cache.kpe), {"ckv_scale_arr": cache.ckv_scale, "kpe_scale": cache.kpe_scale}
        else:
            kv, scales = (cache.latent, cache.rope), {}
        if cache.page_size != plan.page_size or kv[0].dtype != plan.kv_dtype:
            raise ValueError("flashinfer_mla.run: cache page size or dtype differ from the plan")
        if plan.wrapper is not None:
            plan.wrapper.run(query=q, kv_cache=kv, out=out, lse=lse, return_lse=lse is not None,
                             return_lse_base_on_e=lse is not None, **scales)
        return out

    def decode(self, q, cache, page_table, seq_lens, query_start_loc, softmax_scale, *, out=None,
               return_lse=False):
        """The one-shot op (the registry's signature): out, or (out, lse); None when FlashInfer cannot
        take the call. Plans when the metadata tensors are new, else reuses the step's plan."""
        if unsupported_reason(q, cache, page_table, out) is not None:
            return None
        if _capturing(q.device):
            raise RuntimeError(f"{KERNEL_NAME}: FlashInfer's MLA plans on the host per step and cannot be "
                               "captured in a CUDA graph; serve with graphs off (enforce_eager)")
        T, H = q.shape[:2]
        out = q.new_empty(T, H, D_LATENT) if out is None else out
        lse = torch.empty(T, H, dtype=torch.float32, device=q.device) if return_lse else None
        config = (q.device, H, cache.page_size, float(softmax_scale), return_lse)
        metadata = (page_table, seq_lens, query_start_loc)
        key = tuple((t.data_ptr(), t.device, tuple(t.shape), t.stride(), t._version) for t in metadata)
        with self._lock:
            held = self._planned.get(config)
            if held is None or held[0] != key:
                try:
                    plan = self.plan(query_start_loc, seq_lens, page_table, H, page_size=cache.page_size,
                                     softmax_scale=softmax_scale, with_lse=return_lse)
                except FlashInferUnsupported:
                    return None
                if config not in self._planned and len(self._planned) >= MAX_CONFIGS:
                    self._planned.pop(next(iter(self._planned)))
                held = self._planned[config] = (key, plan, metadata)
        self.run(held[1], q, cache, out, lse)
        return (out, lse) if return_lse else out


def load_library():
    """Import `flashinfer.mla` and check it has the planned MLA API this adapter drives."""
    lib = importlib.import_module(f"{LIBRARY}.mla")
    missing = [n for n in ("BatchMLAPagedAttentionWrapper", "MLAPlanMetadata") if not hasattr(lib, n)]
    if missing:
        version = getattr(importlib.import_module(LIBRARY), "__version__", "?")
        raise ImportError(f"{LIBRARY} {version} lacks flashinfer.mla.{', '.join(missing)} (0.7.2's MLA API)")
    return lib


def _next_kernel(q, cache, page_table, seq_lens, query_start_loc, softmax_scale, *, out, return_lse,
                 **plan_overrides):
    """What FlashInfer does not take: our Triton kernel on a GPU where Triton imports, else the reference."""
    from ._triton import HAS_TRITON

    if q.is_cuda and HAS_TRITON:
        from .decode import mla_decode

        return mla_decode(q, cache, page_table, seq_lens, query_start_loc, softmax_scale, out=out,
                          return_lse=return_lse, **plan_overrides)
    from .reference import mla_decode_reference

    o, lse = mla_decode_reference(q, cache, page_table, seq_lens, query_start_loc, softmax_scale)
    o = o if out is None else out.copy_(o)
    return (o, lse) if return_lse else o


# sm_90 only, above our Triton kernel (PLUGIN band) for bf16 caches: what the H200 measured (mla/NOTES.md,
# "FlashInfer's MLA"). Other architectures are unmeasured, so it is not a candidate there (no override either).
CAPABILITY = {"device_types": ("cuda",), "vendors": ("nvidia",), "min_compute_capability": (9, 0),
              "max_compute_capability": (9, 0)}


def register(registry=None, *, page_sizes, load: Callable[[], object] = load_library, **options):
    """Register `mla_decode_flashinfer` (PLUGIN + 2 on sm_90, above mla_decode_sm90, bf16 caches of `page_sizes`; the impl is a
    :class:`~lightspeed_mla.flashinfer_graph.FlashInferDecodeOp`: the one-shot call and plan / bind / run);
    `load()` returns `flashinfer.mla` at the first call; `options` go to :class:`FlashInferMLA`. Returns
    the lazy holder."""
    import lightspeed_kernel as lk
    from lightspeed_kernel.flashinfer import LazyLibrary

    from .flashinfer_graph import FlashInferDecodeOp

    lazy = LazyLibrary(load, lambda lib: FlashInferMLA(lib, **options), KERNEL_NAME)
    lk.register_kernel("mla", "decode", name=KERNEL_NAME, solution="flashinfer", priority=lk.Priority.of(lk.Priority.PLUGIN, 2),
                       capability=CAPABILITY, dtypes=(torch.bfloat16,), features=FEATURES,
                       traits={"page_size": tuple(page_sizes), "kv_dtype": ("bf16",)},
                       tags=("flashinfer", "latency", "throughput"), registry=registry)(FlashInferDecodeOp(lazy))
    return lazy


def discover(registry=None, **kwargs) -> tuple[bool, str | None]:
    """Register the kernel when the library is installed: (available, why not)."""
    try:
        found = importlib.util.find_spec(LIBRARY) is not None
    except (ImportError, ValueError) as e:  # a stub in sys.modules without a spec, a broken parent
        return False, f"{LIBRARY} unavailable: {type(e).__name__}: {e}"
    if not found:
        return False, NOT_INSTALLED
    register(registry, **kwargs)
    return True, None
