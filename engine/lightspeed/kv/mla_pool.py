"""Paged KV pools for multi-head latent attention (DeepSeek-V2/V3, Kimi-K2), indexed by page id.

Design: an MLA layer caches one shared row per token, the 512-wide compressed latent plus the
64-wide rope key (lightspeed_mla's absorbed format), instead of K and V per head. The pool keeps
every layer's rows in tensors whose PAGE AXIS IS DIM 1, so a page copy between two pools is one
`index_select` / `index_copy_` over dim 1 per tensor for all layers at once:

* unquantised: one tensor `[L, pages, page_size, 576]` in the model's dtype (bf16 on GPU, fp32 on
  CPU for exact tests);
* fp8 (`--kv-cache-dtype fp8`): three tensors, latent e4m3 `[L, pages, page_size, 512]`, its fp32
  scale per token `[L, pages, page_size]` and the rope part in bf16 `[L, pages, page_size, 64]`
  (644 bytes a token and layer instead of 1152).

`page_tensors` lists them (the page-copy interface shared with the MHA pool: the copier moves pages
of any pool by its `page_tensors`); `kv_caches[l]` is layer l's `lightspeed_mla.MLACache` view,
which is what `AttentionMetadata.kv_caches` hands the MLA attention layer. Page 0 is the padding
page, as in the MHA pool.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from .pool import KVCache, _pin, _unpin

MLA_LATENT_DIM, MLA_ROPE_DIM = 512, 64
MLA_ROW = MLA_LATENT_DIM + MLA_ROPE_DIM
MLA_MAX_PAGE_SIZE = 256  # the mla/* kernels' page_size trait: powers of two up to 256 (64 is tuned)


@dataclass(frozen=True)
class MLALayout:
    """Shape of one token's latent KV in every layer.

    dtype: the packed rows' dtype for unquantised caches, float8_e4m3fn for the FP8 format.
    """

    num_layers: int
    page_size: int
    dtype: torch.dtype

    @property
    def kind(self) -> str:
        """lightspeed_mla.MLACache kind: "fp8", or "bf16" for the unquantised packed layout."""
        return "fp8" if self.dtype == torch.float8_e4m3fn else "bf16"

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one token in one layer."""
        if self.kind == "fp8":
            return MLA_LATENT_DIM + 4 + MLA_ROPE_DIM * 2
        return MLA_ROW * torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_page(self) -> int:
        """One page over all layers, in bytes."""
        return self.num_layers * self.page_size * self.bytes_per_token

    def pages_for(self, budget_bytes: int) -> int:
        return int(budget_bytes // self.bytes_per_page)


class MLAKVPool:
    """One tier (device or host) of paged latent KV for every layer."""

    k_scale = None  # the MHA pool's per-cache fp8 scales; MLA's fp8 format scales per token
    v_scale = None

    def __init__(self, layout: MLALayout, num_pages: int, device: torch.device | str, *, pin_memory: bool = False,
                 zero_all: bool = True):
        if num_pages < 2:
            raise ValueError(f"a KV pool needs at least 2 pages (page 0 is padding), got {num_pages}")
        from lightspeed_mla import MLACache

        self.layout, self.num_pages, self.device = layout, num_pages, torch.device(device)
        lead = (layout.num_layers, num_pages, layout.page_size)
        if layout.kind == "fp8":
            latent = torch.empty(*lead, MLA_LATENT_DIM, dtype=torch.float8_e4m3fn, device=self.device)
            scale = torch.empty(*lead, dtype=torch.float32, device=self.device)  # [L, pages, page_size]
            rope = torch.empty(*lead, MLA_ROPE_DIM, dtype=torch.bfloat16, device=self.device)
            self.page_tensors = [latent, scale, rope]
            self.kv_caches = [MLACache("fp8", latent[i], rope[i], scale[i].unsqueeze(-1))
                              for i in range(layout.num_layers)]
        else:
            packed = torch.empty(*lead, MLA_ROW, dtype=layout.dtype, device=self.device)  # [L, pages, ps, 576]
            self.page_tensors = [packed]
            # Built directly rather than MLACache.from_packed, which insists on bf16: the references
            # also run fp32 caches (CPU), the Triton kernels get bf16 ones (the registry checks).
            self.kv_caches = [MLACache("bf16", packed[i, ..., :MLA_LATENT_DIM], packed[i, ..., MLA_LATENT_DIM:],
                                       None, packed[i]) for i in range(layout.num_layers)]
        for t in self.page_tensors:
            if pin_memory:  # registered in place, as the MHA host tier (see pool._pin)
                _pin(t)
                weakref.finalize(self, _unpin, t)
            # Zeros, so slots never written stay finite; a host tier only ever receives whole pages.
            (t if zero_all else t[:, 0]).zero_()

    @property
    def bytes_per_page(self) -> int:
        return self.layout.bytes_per_page

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.page_tensors)

    def host_mirror(self, num_pages: int) -> MLAKVPool:
        """A host pool of the same layout and tensors (but `num_pages`), pinned when this pool is on a
        GPU, for the host tier."""
        return MLAKVPool(self.layout, num_pages, "cpu", pin_memory=self.device.type == "cuda", zero_all=False)


class MLAKVCache(KVCache):
    """`KVCache` over MLA pools: the device pool, the optional host pool under it, and the copier."""

    pool_class = MLAKVPool


def kv_layout_for(model_config, page_size: int, kv_dtype: torch.dtype, tp_size: int = 1, tp_rank: int = 0):
    """The KV layout a model needs on tensor-parallel rank `tp_rank` of `tp_size`: `MLALayout` for
    MLA models (one latent row per token on every rank), else the MHA `KVLayout` of the rank's KV heads."""
    from .pool import KVLayout

    if getattr(model_config, "mla", None) is not None:
        if page_size > MLA_MAX_PAGE_SIZE:
            raise ValueError(f"page_size={page_size}: the MLA kernels take pages of up to {MLA_MAX_PAGE_SIZE} tokens")
        return MLALayout(model_config.num_hidden_layers, page_size, kv_dtype)
    return KVLayout(model_config.num_hidden_layers, model_config.num_kv_heads_per_rank(tp_size, tp_rank),
                    model_config.head_dim, page_size, kv_dtype)


def build_kv_cache(layout, num_device_pages: int, num_host_pages: int, device: torch.device | str):
    """`MLAKVCache` for an `MLALayout`, `KVCache` for a `KVLayout`."""
    from .pool import KVCache

    if isinstance(layout, MLALayout):
        return MLAKVCache(layout, num_device_pages, num_host_pages, device)
    return KVCache(layout, num_device_pages, num_host_pages, device)
