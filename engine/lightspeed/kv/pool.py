"""Paged KV pools for MHA/GQA, indexed by page id (page 0 = the padding page).

Design: all layers' K and V live in ONE tensor `[2 * num_layers, num_pages, page_size, Hkv, D]`,
and layer l's (k, v) are the views [2l] and [2l+1] (each `[num_pages, page_size, Hkv, D]`, the
layout the attention kernels read). Because the page axis is shared, copying a set of pages between
the device pool and the host pool is a single `index_select` + `index_copy_` over dim 1 for all
layers at once: no per-page and no per-layer Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
    (`k_scale`, `v_scale`: float32 scalars shared by all layers, 1.0 unless calibrated).
    """

    def __init__(self, layout: KVLayout, num_pages: int, device: torch.device | str, *, pin_memory: bool = False):
        if num_pages < 2:
            raise ValueError(f"a KV pool needs at least 2 pages (page 0 is padding), got {num_pages}")
        self.layout = layout
        self.num_pages = num_pages
        self.device = torch.device(device)
        shape = (2 * layout.num_layers, num_pages, layout.page_size, layout.num_kv_heads, layout.head_dim)
        # buffer: [2L, num_pages, page_size, Hkv, D]; zeros so the padding page is finite.
        self.buffer = torch.zeros(shape, dtype=layout.dtype, device=self.device, pin_memory=pin_memory)
        self.kv_caches = [(self.buffer[2 * i], self.buffer[2 * i + 1]) for i in range(layout.num_layers)]
        self.is_fp8 = layout.dtype == torch.float8_e4m3fn
        self.k_scale = torch.ones((), dtype=torch.float32, device=self.device) if self.is_fp8 else None
        self.v_scale = torch.ones((), dtype=torch.float32, device=self.device) if self.is_fp8 else None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def copy_pages(src: KVPool, dst: KVPool, src_pages: torch.Tensor, dst_pages: torch.Tensor) -> None:
    """dst page dst_pages[i] <- src page src_pages[i], for all layers, K and V, in one batched copy.

    src_pages, dst_pages: int64 [N] on (or movable to) their pool's device. Host <-> device copies go
    through one staging tensor; a pinned host pool lets the upload run asynchronously.
    """
    if src.layout != dst.layout:
        raise ValueError(f"KV layouts differ: {src.layout} vs {dst.layout}")
    if src_pages.numel() == 0:
        return
    if src_pages.shape != dst_pages.shape:
        raise ValueError(f"page lists differ in length: {tuple(src_pages.shape)} vs {tuple(dst_pages.shape)}")
    # Copy raw bits through a same-width integer view: exact, and fp8 has no CPU index_copy.
    src_bits, dst_bits = _bits(src.buffer), _bits(dst.buffer)
    gathered = src_bits.index_select(1, src_pages.to(src.device, non_blocking=True))
    if gathered.device != dst.device:
        gathered = gathered.to(dst.device, non_blocking=dst.device.type == "cuda")
    dst_bits.index_copy_(1, dst_pages.to(dst.device, non_blocking=True), gathered)


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(_INT_OF_WIDTH[t.element_size()])


class KVCache:
    """The device pool, the host pool, and the plan's copies between them."""

    def __init__(self, layout: KVLayout, num_device_pages: int, num_host_pages: int, device: torch.device | str):
        self.layout = layout
        self.device_pool = KVPool(layout, num_device_pages, device)
        on_gpu = torch.device(device).type == "cuda"
        self.host_pool = KVPool(layout, num_host_pages, "cpu", pin_memory=on_gpu)

    @property
    def kv_caches(self):
        return self.device_pool.kv_caches

    def load_back(self, pairs) -> None:
        """Host -> device: pairs is int [N, 2] of (host page, device page) (numpy or tensor)."""
        pairs = torch.as_tensor(pairs, dtype=torch.int64)
        if pairs.numel():
            copy_pages(self.host_pool, self.device_pool, pairs[:, 0], pairs[:, 1])

    def write_back(self, pairs) -> None:
        """Device -> host: pairs is int [M, 2] of (device page, host page)."""
        pairs = torch.as_tensor(pairs, dtype=torch.int64)
        if pairs.numel():
            copy_pages(self.device_pool, self.host_pool, pairs[:, 0], pairs[:, 1])
            if self.device_pool.device.type == "cuda":
                # The host copy must be complete before the scheduler reuses the device pages.
                torch.cuda.current_stream(self.device_pool.device).synchronize()


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
