"""A stand-in for `flashinfer.mla` as far as lightspeed_mla.flashinfer_mla drives it, for CPU tests.

plan() checks the CSR metadata the way FlashInfer's planner does (host int32 indptrs and lengths, page
counts equal to ceil(kv_len / page_size), kv_indices long enough and on the workspace's device) and
keeps it; run() rebuilds a page table from the CSR and computes with our reference, an FP8 cache
dequantised as FlashInfer documents it (ckv times its per-(token, 128-column) scale, kpe times one
scale), the LSE in base e or 2 as asked. Installed as `flashinfer` + `flashinfer.mla` in sys.modules.
"""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types
from dataclasses import dataclass

import torch
from lightspeed_mla import MLACache, mla_decode_reference
from lightspeed_mla.flashinfer_mla import FlashInferFP8Cache


@dataclass(frozen=True)
class MLAPlanMetadata:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_len_arr: torch.Tensor

    @classmethod
    def csr(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr):
        return cls(qo_indptr, kv_indptr, kv_indices, kv_len_arr)


class BatchMLAPagedAttentionWrapper:
    log: list = []  # ("plan" | "run", backend), shared by all wrappers; reset by install()

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        assert float_workspace_buffer.dtype == torch.uint8 and not use_cuda_graph
        self.device, self.backend, self.planned = float_workspace_buffer.device, backend, None

    def plan(self, *, metadata, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale, q_data_type,
             kv_data_type, query_layout="packed", kv_cache_layout="packed", lse_mode="none"):
        m = metadata
        for t in (m.qo_indptr, m.kv_indptr, m.kv_len_arr):  # read on the host by FlashInfer's planner
            assert t.device.type == "cpu" and t.dtype == torch.int32 and t.is_contiguous() and t.dim() == 1
        assert m.kv_indices.dtype == torch.int32 and m.kv_indices.device == self.device and m.kv_indices.dim() == 1
        batch = m.kv_len_arr.numel()
        assert m.qo_indptr.numel() == m.kv_indptr.numel() == batch + 1 and int(m.kv_indptr[0]) == 0
        pages = (m.kv_len_arr.long() + page_size - 1) // page_size
        assert torch.equal(m.kv_indptr[1:].long() - m.kv_indptr[:-1].long(), pages), "page counts != ceil(kv_len/ps)"
        assert m.kv_indices.numel() >= int(m.kv_indptr[-1])
        assert (head_dim_ckv, head_dim_kpe, causal, lse_mode in ("none", "basee")) == (512, 64, True, True)
        assert isinstance(sm_scale, float) and self.backend in ("fa2", "fa3")
        table = torch.zeros(batch, max(pages.tolist() + [1]), dtype=torch.int32)
        for b in range(batch):
            start, n = int(m.kv_indptr[b]), int(pages[b])
            table[b, :n] = m.kv_indices[start:start + n].cpu()
        self.planned = dict(table=table, qsl=m.qo_indptr.clone(), lens=m.kv_len_arr.clone(), scale=sm_scale,
                            heads=num_heads, page_size=page_size, q_dtype=q_data_type, kv_dtype=kv_data_type,
                            lse_mode=lse_mode, layouts=(query_layout, kv_cache_layout))
        self.log.append(("plan", self.backend))

    def run(self, *, query, kv_cache, out=None, lse=None, return_lse=False, return_lse_base_on_e=False,
            ckv_scale=None, ckv_scale_arr=None, kpe_scale=None):
        p = self.planned
        assert p is not None and p["layouts"] == ("packed", "split") and isinstance(kv_cache, tuple)
        assert (p["lse_mode"] == "basee") == return_lse == return_lse_base_on_e == (lse is not None)
        ckv, kpe = kv_cache
        assert query.dtype == p["q_dtype"] and ckv.dtype == kpe.dtype == p["kv_dtype"]
        assert query.shape[1] == p["heads"] and ckv.shape[1] == p["page_size"]
        if ckv.dtype == torch.float8_e4m3fn:
            assert ckv_scale is None and ckv_scale_arr is not None and kpe_scale is not None
            cache = FlashInferFP8Cache(ckv, kpe, ckv_scale_arr, kpe_scale).dequantized()
        else:
            assert ckv_scale is ckv_scale_arr is kpe_scale is None
            cache = MLACache("bf16", ckv, kpe)
        dev = query.device
        o, natural = mla_decode_reference(query, cache, p["table"].to(dev), p["lens"].to(dev), p["qsl"].to(dev),
                                          p["scale"])
        out.copy_(o)
        if lse is not None:
            lse.copy_(natural if return_lse_base_on_e else natural / math.log(2))
        self.log.append(("run", self.backend))
        return (out, lse) if return_lse else out


def install(monkeypatch) -> types.ModuleType:
    """Put the stand-in in sys.modules as `flashinfer` / `flashinfer.mla` (with specs, so find_spec finds it)."""
    BatchMLAPagedAttentionWrapper.log = []
    root = types.ModuleType("flashinfer")
    root.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    root.__version__ = "0.7.2.post1+standin"
    mla = types.ModuleType("flashinfer.mla")
    mla.__spec__ = importlib.machinery.ModuleSpec("flashinfer.mla", None)
    mla.BatchMLAPagedAttentionWrapper, mla.MLAPlanMetadata = BatchMLAPagedAttentionWrapper, MLAPlanMetadata
    root.mla = mla
    monkeypatch.setitem(sys.modules, "flashinfer", root)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", mla)
    return mla
