"""Paged KV memory: device and host pools indexed by page id, and the copies between them."""

from .copier import CudaPageCopier, KVTransferError, PageCopier, ThreadPageCopier, copy_pages, page_runs
from .mla_pool import MLAKVCache, MLAKVPool, MLALayout, build_kv_cache, kv_layout_for
from .pool import KVCache, KVLayout, KVPool, device_kv_budget, resolve_kv_dtype

__all__ = ["CudaPageCopier", "KVCache", "KVLayout", "KVPool", "KVTransferError", "MLAKVCache", "MLAKVPool",
           "MLALayout", "PageCopier", "ThreadPageCopier", "build_kv_cache", "copy_pages", "device_kv_budget",
           "kv_layout_for", "page_runs", "resolve_kv_dtype"]
