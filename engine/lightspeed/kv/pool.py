"""Paged KV pools for MHA/GQA, indexed by page id (page 0 = the padding page).

Design: all layers' K and V live in ONE tensor `[2 * num_layers, num_pages, page_size, Hkv, D]`,
and layer l's (k, v) are the views [2l] and [2l+1] (each `[num_pages, page_size, Hkv, D]`, the
layout the attention kernels read). Because the page axis is shared, a run of pages is one strided
span for all layers at once: the copier (copier.py) moves it with a single 2-D DMA.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .copier import make_copier

_KV_DTYPES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
    "fp32": torch.float32, "float32": torch.float32,
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
}


def resolve_kv_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """"auto" -> the model's dtype; otherwise the named dtype (ValueError if unknown)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    try:
        return _KV_DTYPES[kv_cache_dtype]
    except KeyError:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected auto, {', '.join(_KV_DTYPES)}") from None


@dataclass(frozen=True)
class KVLayout:
    """Shape of one token's KV in every layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype

    @property
    def bytes_per_page(self) -> int:
        """K + V of one page over all layers, in bytes."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * itemsize

    def pages_for(self, budget_bytes: int) -> int:
        return int(budget_bytes // self.bytes_per_page)


class KVPool:
    """One tier of paged KV memory (device or host) for every layer.

    kv_caches[l] = (k, v), each `[num_pages, page_size, Hkv, D]`. fp8 pools store value / scale
    (`k_scale`, `v_scale`: float32 scalars shared by all layers, fixed at 1.0: no calibration; values
    beyond the e4m3 range, +-448, saturate).
    `page_tensors` is what page copies move (page axis at dim 1).
    """

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str, *, pin_memory: bool = False,
                 zero_all: bool = True):
        if num_pages < 2:
            raise ValueError(f"a KV pool needs at least 2 pages (page 0 is padding), got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        self.device = torch.device(device)
        shape = (2 * layout.num_layers, num_pages, layout.page_size, layout.num_kv_heads, layout.head_dim)
        # buffer: [2L, num_pages, page_size, Hkv, D]. Zeros, so slots never written stay finite (a
        # masked NaN still poisons attention: 0 * NaN). A host tier only ever holds pages copied in
        # whole, so only its padding page is cleared: writing 64 GiB of pinned memory takes seconds.
        self.buffer = torch.empty(shape, dtype=layout.dtype, device=self.device)
        if pin_memory:
            _pin(self.buffer)
            # Unpinned before its memory is freed: an address range registered twice is an error.
            weakref.finalize(self, _unpin, self.buffer)
        (self.buffer if zero_all else self.buffer[:, 0]).zero_()
        self.page_tensors = [self.buffer]
        self.kv_caches = [(self.buffer[2 * i], self.buffer[2 * i + 1]) for i in range(layout.num_layers)]
        self.is_fp8 = layout.dtype == torch.float8_e4m3fn
        self.k_scale = torch.ones((), dtype=torch.float32, device=self.device) if self.is_fp8 else None
        self.v_scale = torch.ones((), dtype=torch.float32, device=self.device) if self.is_fp8 else None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def host_mirror(self, num_pages: int) -> KVPool:
        """A host pool of the same layout (pinned when this pool is on a GPU), for the host tier."""
        return KVPool(self.layout, num_pages, "cpu", pin_memory=self.device.type == "cuda", zero_all=False)


def _pin(tensor: torch.Tensor) -> None:
    """Page-lock a CPU tensor in place for asynchronous DMA. (torch's pinned allocator rounds every
    allocation up to a power of two: a 48 GiB host tier would pin 64 GiB.)"""
    nbytes = tensor.numel() * tensor.element_size()
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), nbytes, 0))


def _unpin(tensor: torch.Tensor) -> None:
    try:
        torch.cuda.cudart().cudaHostUnregister(tensor.data_ptr())
    except RuntimeError:
        pass  # CUDA already shut down at interpreter exit: the process frees everything anyway


class KVCache:
    """The device pool, the optional host pool (the tier under it), and the copier between them.

    `num_host_pages=0` switches the host tier off: no host memory, and plans never copy.
    """

    pool_class = KVPool  # MLAKVCache: the same tiers over MLA latent pools

    def __init__(self, layout, num_device_pages: int, num_host_pages: int, device: torch.device | str):
        self.layout = layout
        self.device_pool = self.pool_class(layout, num_device_pages, device)
        self.host_pool = self.device_pool.host_mirror(num_host_pages) if num_host_pages else None
        self.copier = make_copier(self.device_pool, self.host_pool, self.device_pool.device)
        self.disk = None  # the disk tier under the host pool (kv.disk.DiskKVTier), when configured

    @property
    def kv_caches(self):
        return self.device_pool.kv_caches


def device_kv_budget(device: torch.device, gpu_memory_utilization: float, kv_cache_memory: int | None,
                     reserve_bytes: int) -> int:
    """Bytes for the device KV pool.

    CPU: `kv_cache_memory` (default 1 GiB). GPU: `kv_cache_memory` when given, else
    total * utilisation - (memory already used by weights and others) - reserve for activations.
    """
    if kv_cache_memory is not None:
        return int(kv_cache_memory)
    if device.type != "cuda":
        return 1 << 30
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    budget = int(total * gpu_memory_utilization) - used - reserve_bytes
    if budget <= 0:
        raise ValueError(
            f"no GPU memory left for the KV cache: {used / 2**30:.1f} GiB used of {total / 2**30:.1f} GiB with "
            f"gpu_memory_utilization={gpu_memory_utilization}; raise it or lower max_num_batched_tokens")
    return budget
