"""Paged KV memory: device and host pools indexed by page id, and the copies between them."""

from .pool import KVCache, KVLayout, KVPool, copy_pages, device_kv_budget, resolve_kv_dtype

__all__ = ["KVCache", "KVLayout", "KVPool", "copy_pages", "device_kv_budget", "resolve_kv_dtype"]
