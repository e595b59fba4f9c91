"""Shared test builders: paged caches with shuffled pages, random queries, error metrics."""

from __future__ import annotations

import torch
from lightspeed_mla import MLACache, pack_kv_reference


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert not torch.isnan(out).any(), "NaN in output"
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_paged_cache(kind: str, page_size: int, lens: list[int], device="cpu", spare_pages: int = 2,
                     generator: torch.Generator | None = None):
    """A cache holding ``lens[b]`` random tokens for each request, on shuffled pages.

    Returns (cache, page_table [B, max_pages] int32). Unused page-table entries point at a page
    full of huge values, so a kernel that reads past a request's length shows it.
    """
    pages_per = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per) + spare_pages + 1
    cache = MLACache.empty(num_pages, page_size, kind, device=device)
    poison_page = num_pages - 1
    if kind == "bf16":
        cache.packed.fill_(1e4)
    else:
        cache.latent.copy_(torch.full_like(cache.latent, 448.0, dtype=torch.float32).to(torch.float8_e4m3fn))
        cache.scale.fill_(100.0)
        cache.rope.fill_(1e4)
    perm = torch.randperm(num_pages - 1, generator=generator).to(torch.int32)
    page_table = torch.full((len(lens), max(pages_per + [1])), poison_page, dtype=torch.int32)
    k = 0
    for b, n in enumerate(pages_per):
        page_table[b, :n] = perm[k:k + n]
        k += n
    total = sum(lens)
    latent = torch.randn(total, 512, generator=generator)
    rope = torch.randn(total, 64, generator=generator)
    slots = torch.cat([
        page_table[b][torch.arange(n) // page_size].long() * page_size + torch.arange(n) % page_size
        for b, n in enumerate(lens)
    ]) if total else torch.zeros(0, dtype=torch.long)
    pack_kv_reference(latent.to(device), rope.to(device), slots.to(device), cache)
    return cache, page_table.to(device)


def query_start(q_lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(q_lens, dtype=torch.int64).cumsum(0)), dtype=torch.int32)
