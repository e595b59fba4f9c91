"""A stand-in for `flashinfer.mla` as far as lightspeed_mla.flashinfer_mla drives it, for CPU tests.

plan() checks the CSR metadata the way FlashInfer's planner does (host int32 indptrs and lengths, page
counts equal to ceil(kv_len / page_size), kv_indices long enough and on the workspace's device) and
keeps it, in `use_cuda_graph=True` mode in buffers fixed at the first plan (see the wrapper); run()
rebuilds a page table from the schedule and kv_indices as they are when it runs and computes with our
reference, an FP8 cache
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


def _interval(t: torch.Tensor) -> tuple:
    start = t.storage_offset() * t.element_size()
    return t.untyped_storage().data_ptr(), start, start + t.numel() * t.element_size()


def _overlap(x: tuple, y: tuple) -> bool:
    return x[0] == y[0] and max(x[1], y[1]) < min(x[2], y[2])


class BatchMLAPagedAttentionWrapper:
    """plan() keeps the schedule in an "int workspace" tensor (on the device, as FlashInfer's), and run()
    computes from what that workspace and the kv_indices buffer hold when it runs, never from Python
    state of the plan: running it again without a plan is a graph replay. In CUDA-graph mode the
    reserved buffers and the workspace are fixed at the first plan, as FlashInfer's are: buffer shapes
    must match exactly (kv_indices may be longer), buffers may not overlap, sources may not overlap
    targets unless they are the same tensor, and the launch a graph would bake in (cluster size, from
    the batch layout) may not change on a re-plan."""

    log: list = []  # ("plan" | "run", backend), shared by all wrappers; reset by install()

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        assert float_workspace_buffer.dtype == torch.uint8
        self.device, self.backend, self.use_cuda_graph = float_workspace_buffer.device, backend, use_cuda_graph
        self._reserved = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        self._int_workspace = self._kv_indices_buf = self._launch = self._config = None
        self.plans = 0

    def _stage_graph_metadata(self, m) -> None:
        sources = (m.qo_indptr, m.kv_indptr, m.kv_indices, m.kv_len_arr)
        assert all(r is not None for r in self._reserved), "CUDA graph mode requires reserved buffers"
        for i, (reserved, source) in enumerate(zip(self._reserved, sources, strict=True)):
            assert reserved.dtype == torch.int32 and reserved.device == self.device and reserved.is_contiguous()
            assert reserved.shape[0] >= source.shape[0] if i == 2 else reserved.shape == source.shape, \
                "reserved buffer has insufficient or incompatible capacity"
        intervals = [_interval(r) for r in self._reserved]
        assert not any(_overlap(x, y) for i, x in enumerate(intervals) for y in intervals[i + 1:])
        targets = [r[: s.shape[0]] for r, s in zip(self._reserved, sources, strict=True)]
        for i, source in enumerate(sources):
            for j, target in enumerate(targets):
                if _overlap(_interval(source), _interval(target)):
                    assert i == j and _interval(source) == _interval(target), "source overlaps another target"
        for target, source in zip(targets, sources, strict=True):
            if target.data_ptr() != source.data_ptr():
                target.copy_(source, non_blocking=True)
        self._kv_indices_buf = self._reserved[2]

    def plan(self, *, metadata, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale, q_data_type,
             kv_data_type, query_layout="packed", kv_cache_layout="packed", lse_mode="none"):
        m = metadata
        for t in (m.qo_indptr, m.kv_indptr, m.kv_len_arr):  # read on the host by FlashInfer's planner
            assert t.device.type == "cpu" and t.dtype == torch.int32 and t.is_contiguous() and t.dim() == 1
            assert self.device.type != "cuda" or t.is_pinned(), "pageable host metadata: the copy would wait"
        assert m.kv_indices.dtype == torch.int32 and m.kv_indices.device == self.device and m.kv_indices.dim() == 1
        batch = m.kv_len_arr.numel()
        assert m.qo_indptr.numel() == m.kv_indptr.numel() == batch + 1 and int(m.kv_indptr[0]) == 0
        pages = (m.kv_len_arr.long() + page_size - 1) // page_size
        assert torch.equal(m.kv_indptr[1:].long() - m.kv_indptr[:-1].long(), pages), "page counts != ceil(kv_len/ps)"
        assert m.kv_indices.numel() >= int(m.kv_indptr[-1])
        assert (head_dim_ckv, head_dim_kpe, causal, lse_mode in ("none", "basee")) == (512, 64, True, True)
        assert isinstance(sm_scale, float) and self.backend in ("fa2", "fa3")
        q_lens = m.qo_indptr[1:] - m.qo_indptr[:-1]
        assert (q_lens <= m.kv_len_arr).all(), "a request with more query tokens than keys"
        cluster = 2 if int(q_lens.sum()) * num_heads // max(batch, 1) > 64 else 1  # MLAPlan's num_blks_x
        config = dict(scale=sm_scale, heads=num_heads, page_size=page_size, q_dtype=q_data_type,
                      kv_dtype=kv_data_type, lse_mode=lse_mode, layouts=(query_layout, kv_cache_layout))
        schedule = torch.cat([m.qo_indptr, m.kv_indptr, m.kv_len_arr])  # what the work list encodes
        if self.use_cuda_graph:
            if self._launch is not None:  # a captured launch keeps its grid and arguments
                assert (cluster, config) == (self._launch, self._config), "re-plan changes the captured launch"
            self._stage_graph_metadata(m)
            if self._int_workspace is None:
                self._int_workspace = torch.empty(schedule.numel(), dtype=torch.int32, device=self.device)
            assert self._int_workspace.numel() == schedule.numel(), "the batch size is fixed in CUDA graph mode"
            self._int_workspace.copy_(schedule, non_blocking=True)
        else:
            self._kv_indices_buf = m.kv_indices.to(self.device, non_blocking=True)  # the same tensor when there
            self._int_workspace = schedule.to(self.device)
        self._launch, self._config, self.plans = cluster, config, self.plans + 1
        self.log.append(("plan", self.backend))

    def run(self, *, query, kv_cache, out=None, lse=None, return_lse=False, return_lse_base_on_e=False,
            ckv_scale=None, ckv_scale_arr=None, kpe_scale=None):
        p = self._config
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
        schedule = self._int_workspace.cpu()  # read at run time: a replay sees the latest plan's schedule
        batch = (schedule.numel() - 2) // 3
        qsl, kv_indptr, lens = schedule[: batch + 1], schedule[batch + 1: 2 * batch + 2], schedule[2 * batch + 2:]
        assert query.shape[0] >= int(qsl[-1])
        pages = (lens.long() + p["page_size"] - 1) // p["page_size"]
        indices = self._kv_indices_buf.cpu()
        table = torch.zeros(batch, max(pages.tolist() + [1]), dtype=torch.int32)
        for b in range(batch):
            start, n = int(kv_indptr[b]), int(pages[b])
            table[b, :n] = indices[start:start + n]
        dev = query.device
        o, natural = mla_decode_reference(query, cache, table.to(dev), lens.to(dev), qsl.to(dev), p["scale"])
        rows = int(qsl[-1])  # FlashInfer writes the scheduled rows only
        out[:rows].copy_(o[:rows])
        if lse is not None:
            lse[:rows].copy_((natural if return_lse_base_on_e else natural / math.log(2))[:rows])
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
