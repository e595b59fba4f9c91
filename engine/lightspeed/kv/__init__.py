"""Paged KV memory: device and host pools indexed by page id, and the copies between them."""

from .copier import CudaPageCopier, PageCopier, ThreadPageCopier, copy_pages, page_runs
from .pool import KVCache, KVLayout, KVPool, device_kv_budget, resolve_kv_dtype

__all__ = ["CudaPageCopier", "KVCache", "KVLayout", "KVPool", "PageCopier", "ThreadPageCopier", "copy_pages",
           "device_kv_budget", "page_runs", "resolve_kv_dtype"]
