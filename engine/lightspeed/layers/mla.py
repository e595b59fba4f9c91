"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) over the paged latent cache.

Design note. Per token the cache holds one shared row: the 512-wide normalised KV latent `c` and
the 64-wide rotated rope key `k_r` (`kv/mla_pool.py`). Per head h, K = [W_UK[h] c | k_r] and
V = W_UV[h] c, where W_UK / W_UV are the two halves of `kv_b_proj`. Two ways to attend:
- absorbed (decode, and short extends over a long prefix): fold W_UK into the query,
  q_abs[h] = [q_nope[h] W_UK[h] | q_rope[h]] (576 wide), attend over the 576-wide cached rows with
  the latent itself as the value (`mla/decode`), then apply W_UV to the 512-wide output;
- non-absorbed (long prefill chunks): gather the prefix latents, up-project them with `kv_b_proj`
  into per-head K/V and run `mla/prefill` (head dims 192/128, the compute-dense form).
`lightspeed_mla.choose_prefill_form` picks one per step from its FLOP model; absorbed prefill rows
join the decode rows in one `mla/decode` call with ragged query lengths.

Everything the layers share within a step (the form, the gather indices, the decode plan) is
computed once, by the first layer, into `AttentionMetadata.scratch`. The decode plan depends on
shapes only (rows, tokens, the page table's width), so the Triton plan/run path is cached per shape
and its lengths are the step's device tensors: nothing syncs, and CUDA graphs capture it. A kernel
whose plan also schedules on the host (FlashInfer's MLA decode: the plan has `replan(lengths)`) is
re-planned once a step from the scheduler's host lengths, shared by every layer; inside a CUDA graph
the runner does that before each replay (`AttentionMetadata.plan_on_host`, `HostPlans`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict

import numpy as np
import torch
from lightspeed_kernel import explain, ops, platform_of, select_kernel
from torch import nn

from .attention import AttentionMetadata
from .linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from .norm import RMSNorm
from .parallel import ParallelContext
from .rotary import RotaryEmbedding

log = logging.getLogger("lightspeed.mla")
LATENT, ROPE = 512, 64
_WORKSPACE_BYTES = 64 << 20  # split-KV partials of the Triton decode; the planner fits splits to it
_PLAN_CACHE = 256  # decode plans kept per backend (one per batch shape)


def mla_softmax_scale(qk_head_dim: int, rope_scaling: dict | None) -> float:
    """qk_head_dim^-1/2, times DeepSeek's YaRN correction mscale(factor, mscale_all_dim)^2."""
    scale = qk_head_dim**-0.5
    if rope_scaling and rope_scaling.get("rope_type") not in (None, "default") and rope_scaling.get("mscale_all_dim"):
        scale *= ops.yarn_get_mscale(rope_scaling["factor"], rope_scaling["mscale_all_dim"]) ** 2
    return scale


def _ready_kernel(family: str, mode: str, dtype, **query):
    """The best kernel whose `prepare()` (a JIT build, a library import: what can fail at first use)
    succeeds. A kernel that cannot be prepared is skipped with a warning for the next one in rank,
    unless an override asked for it by name: then its error is the answer."""
    selected = select_kernel(family, mode, dtype, **query)
    try:
        return _prepared(selected.impl)
    except Exception as e:  # noqa: BLE001 - a build or import failure of one candidate
        failed, why = selected.name, e
    ranking = explain(family, mode, dtype, **query)
    if ranking.override is not None:
        raise why
    names = [c.name for c in sorted((c for c in ranking.candidates if c.rank is not None), key=lambda c: c.rank)]
    for name in names[names.index(selected.name) + 1:]:
        log.warning("%s/%s: %s cannot run here (%s); using %s", family, mode, failed, why, name)
        try:
            return _prepared(select_kernel(family, mode, dtype, override=name, **query).impl)
        except Exception as e:  # noqa: BLE001
            failed, why = name, e
    raise why


def _prepared(impl):
    if hasattr(impl, "prepare"):
        impl.prepare()
    return impl


class MLABackend:
    """Kernel selection, the decode workspace and the decode-plan cache, shared by a model's MLA layers."""

    def __init__(self, num_heads: int, softmax_scale: float):
        self.num_heads, self.softmax_scale = num_heads, softmax_scale
        self._kernels: dict[tuple, object] = {}
        self._workspace: dict[torch.device, torch.Tensor] = {}
        self._plans: OrderedDict[tuple, object] = OrderedDict()

    def kernel(self, mode: str, dtype: torch.dtype, device: torch.device, *, fp8_kv: bool = False,
               page_size: int | None = None, head_dims: tuple[int, int] | None = None):
        key = (mode, dtype, device, fp8_kv, page_size, head_dims)
        if key not in self._kernels:
            features = ("paged", "fp8_kv") if fp8_kv else ()
            traits = {}
            if page_size is not None:
                traits = {"page_size": page_size, "kv_dtype": "fp8" if fp8_kv else "bf16"}
            if head_dims is not None:
                features, traits = ("ragged", "causal", "prefix"), {"head_dim_qk": head_dims[0],
                                                                    "head_dim_v": head_dims[1]}
            self._kernels[key] = _ready_kernel("mla", mode, dtype, features=features, traits=traits,
                                               platform=platform_of(device))
        return self._kernels[key]

    def decode_plan(self, impl, meta: AttentionMetadata, rows: int, tokens: int, max_q: int, cache) -> object:
        """A plan for the first `rows` rows (`tokens` query tokens, <= max_q each) from shapes alone,
        bound to the step's device metadata (`impl.bind`). Plans made while a CUDA-graph runner captures
        (`meta.host_plans` set) are asked for as `captured`: a kernel that plans on the host reserves
        fixed buffers for them (FlashInfer), and they are never shared with eager steps."""
        page_size = cache.page_size
        max_pages = 1 << max(0, meta.page_table.shape[1] - 1).bit_length()  # bucketed: a bound is enough
        captured = meta.host_plans is not None
        key = (rows, tokens, max_q, max_pages, cache.kind, page_size, meta.page_table.device, captured)
        plan = self._plans.get(key)
        if plan is None:
            device = meta.page_table.device
            if device not in self._workspace:
                self._workspace[device] = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            # Lengths that realise the bounds: splits and fold follow from them, the kernels read the
            # true lengths from the device (seq_lens / query_start_loc below).
            q_lens = np.ones(rows, dtype=np.int64)
            extra = tokens - rows
            for i in range(rows):
                take = min(extra, max_q - 1)
                q_lens[i] += take
                extra -= take
            qsl = np.concatenate([[0], np.cumsum(q_lens)])
            lens = np.full(rows, max(max_pages * page_size, int(q_lens.max(initial=1))))
            plan = impl.plan(self._workspace[device], qsl, lens, self.num_heads, page_size=page_size,
                             softmax_scale=self.softmax_scale, cache_kind=cache.kind, captured=captured)
            self._plans[key] = plan
            if len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        qsl, seq_lens, table = meta.query_start_loc[: rows + 1], meta.seq_lens[:rows], meta.page_table[:rows]
        if hasattr(impl, "bind"):
            return impl.bind(plan, qsl, seq_lens, table)
        # An impl without `bind` (the original contract): its plan reads the lengths it points at.
        return dataclasses.replace(plan, query_start_loc=qsl, seq_lens=seq_lens)


class _PrefillStep:
    """Per-step facts of the prefill rows, computed once (one host copy of their lengths)."""

    def __init__(self, meta: AttentionMetadata, num_heads: int, page_size: int):
        from lightspeed_mla import choose_prefill_form

        nd = meta.num_decodes
        qsl = meta.prefill_query_start_loc()
        h_qsl = qsl.cpu().numpy().astype(np.int64)  # the one host sync of a prefill step
        h_kv = meta.seq_lens[nd:].cpu().numpy().astype(np.int64)
        q_lens = np.diff(h_qsl)
        self.form = choose_prefill_form(q_lens, h_kv, num_heads)
        self.max_q = int(q_lens.max(initial=0))
        self.cu_q = qsl
        device = meta.seq_lens.device
        self.cu_k = torch.from_numpy(np.concatenate([[0], np.cumsum(h_kv)]).astype(np.int32)).to(device)
        total = int(h_kv.sum())
        # Flat cache slot of every key of every prefill row, in order (prefix, then new tokens).
        lens = torch.from_numpy(h_kv).to(device)
        row = torch.repeat_interleave(torch.arange(len(h_kv), device=device), lens, output_size=total)
        pos = torch.arange(total, device=device) - (self.cu_k[:-1].long())[row]
        pages = meta.page_table[nd:][row, pos // page_size].long()
        self.key_slots = pages * page_size + pos % page_size  # [Tk]


class MLAAttention(nn.Module):
    """DeepSeek MLA of one layer: `forward(positions [T], hidden [T, H], meta) -> [T, H]`.

    Projections (checkpoint names): `q_a_proj`, `q_a_layernorm`, `q_b_proj` with q LoRA, else
    `q_proj`; `kv_a_proj_with_mqa` (latent ‖ rope key), `kv_a_layernorm`, `kv_b_proj` (W_UK ‖ W_UV
    per head), `o_proj`. Heads split over tensor-parallel ranks; the latent is replicated.
    `meta.kv_caches[layer_idx]` is this layer's `lightspeed_mla.MLACache`.
    """

    output_layers = ("o_proj",)  # leaves whose outputs form the block's (placement compiler)

    def __init__(self, config, layer_idx: int, parallel: ParallelContext, rotary_emb: RotaryEmbedding,
                 backend: MLABackend):
        super().__init__()
        mla = config.mla
        hidden, heads = config.hidden_size, config.num_attention_heads
        self.layer_idx, self.backend, self.rotary_emb = layer_idx, backend, rotary_emb
        self.nope, self.rope, self.v_dim = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        self.qk_dim = mla.qk_head_dim
        self.num_heads = parallel.divide(heads, "attention heads")
        bias = config.attention_bias
        if mla.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(hidden, heads * self.qk_dim, False, parallel)
        else:
            self.q_a_proj = ReplicatedLinear(hidden, mla.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, 1e-6)  # DeepSeek's low-rank norms: eps 1e-6
            self.q_b_proj = ColumnParallelLinear(mla.q_lora_rank, heads * self.qk_dim, False, parallel)
        self.kv_a_proj_with_mqa = ReplicatedLinear(hidden, LATENT + ROPE, bias)
        self.kv_a_layernorm = RMSNorm(LATENT, 1e-6)
        self.kv_b_proj = ColumnParallelLinear(LATENT, heads * (self.nope + self.v_dim), False, parallel)
        self.o_proj = RowParallelLinear(heads * self.v_dim, hidden, bias, parallel)
        self._kv_b_dense: torch.Tensor | None = None  # W_UK ‖ W_UV dequantised, for FP8 kv_b_proj

    def finish_loading(self) -> None:
        """After the weights are final: a full-precision copy of an FP8 kv_b_proj for the absorption."""
        weight = self.kv_b_proj.weight
        if weight.dtype == torch.float8_e4m3fn:
            from .quantization import dequantize_weight_fp8

            dtype = self.kv_a_layernorm.weight.dtype
            self._kv_b_dense = dequantize_weight_fp8(weight, self.kv_b_proj.weight_scale_inv, dtype)

    def _absorb_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self._kv_b_dense if self._kv_b_dense is not None else self.kv_b_proj.weight
        w = w.view(self.num_heads, self.nope + self.v_dim, LATENT)
        return w[:, : self.nope], w[:, self.nope:]  # W_UK [H, nope, 512], W_UV [H, v, 512] (views)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        T = hidden.shape[0]
        if hasattr(self, "q_proj"):
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q = q.view(T, self.num_heads, self.qk_dim)
        kv_a = self.kv_a_proj_with_mqa(hidden)  # [T, 576]
        latent = self.kv_a_layernorm(kv_a[:, :LATENT].contiguous())  # [T, 512]
        q_rope, k_rope = self.rotary_emb(positions, q[..., self.nope:], kv_a[:, None, LATENT:])
        q_nope, k_rope = q[..., : self.nope], k_rope.reshape(T, ROPE)
        cache = meta.kv_caches[self.layer_idx]
        store = self.backend.kernel("store", latent.dtype, latent.device, fp8_kv=cache.kind == "fp8",
                                    page_size=cache.page_size)
        store(latent, k_rope.contiguous(), meta.slot_mapping, cache)
        out = self._attend(q_nope, q_rope, cache, meta)  # [T, H, v]
        return self.o_proj(out.reshape(T, self.num_heads * self.v_dim))

    def _attend(self, q_nope, q_rope, cache, meta: AttentionMetadata) -> torch.Tensor:
        nd, ndt = meta.num_decodes, meta.num_decode_tokens
        if meta.num_prefills == 0:
            return self._absorbed(q_nope, q_rope, cache, meta, nd, ndt, meta.decode_query_len)
        step = meta.scratch.get("mla_prefill")
        if step is None:
            step = meta.scratch["mla_prefill"] = _PrefillStep(meta, self.num_heads, cache.page_size)
        rows = meta.seq_lens.shape[0]
        if step.form == "absorbed":  # every row in one absorbed call
            return self._absorbed(q_nope, q_rope, cache, meta, rows, q_nope.shape[0], meta.max_query_len)
        out = q_nope.new_empty(q_nope.shape[0], self.num_heads, self.v_dim)
        if nd:
            out[:ndt] = self._absorbed(q_nope[:ndt], q_rope[:ndt], cache, meta, nd, ndt, meta.decode_query_len)
        out[ndt:] = self._prefill(q_nope[ndt:], q_rope[ndt:], cache, step)
        return out

    def _absorbed(self, q_nope, q_rope, cache, meta, rows: int, tokens: int, max_q: int) -> torch.Tensor:
        w_uk, w_uv = self._absorb_weights()
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, 512]
        q_abs = torch.cat([q_latent, q_rope], dim=-1)  # [T, H, 576]
        latent_out = q_abs.new_empty(tokens, self.num_heads, LATENT)
        impl = self.backend.kernel("decode", q_abs.dtype, q_abs.device, fp8_kv=cache.kind == "fp8",
                                   page_size=cache.page_size)
        table = meta.page_table[:rows]
        if hasattr(impl, "plan"):  # plan/run: no host sync, CUDA-graph capturable
            key = ("mla_decode_plan", rows, tokens)
            plan = meta.scratch.get(key)
            if plan is None:
                plan = meta.scratch[key] = self.backend.decode_plan(impl, meta, rows, tokens, max_q, cache)
                if hasattr(plan, "replan"):  # schedules on the host: once a step, shared by every layer
                    meta.plan_on_host(plan, rows)
            impl.run(plan, q_abs, cache, table, latent_out)
        else:
            impl(q_abs, cache, table, meta.seq_lens[:rows], meta.query_start_loc[: rows + 1],
                 self.backend.softmax_scale, out=latent_out)
        return torch.bmm(latent_out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, v]

    def _prefill(self, q_nope, q_rope, cache, step: _PrefillStep) -> torch.Tensor:
        latent = cache.latent.reshape(-1, LATENT)[step.key_slots]  # [Tk, 512]
        if cache.scale is not None:
            latent = latent.float() * cache.scale.reshape(-1, 1)[step.key_slots]
        latent = latent.to(q_nope.dtype)
        k_rope = cache.rope.reshape(-1, ROPE)[step.key_slots].to(q_nope.dtype)  # [Tk, 64]
        kv = self.kv_b_proj(latent).view(-1, self.num_heads, self.nope + self.v_dim)
        k_nope, v = kv[..., : self.nope], kv[..., self.nope:]
        impl = self.backend.kernel("prefill", q_nope.dtype, q_nope.device, head_dims=(self.qk_dim, self.v_dim))
        out = q_nope.new_empty(q_nope.shape[0], self.num_heads, self.v_dim)
        return impl(q_nope, q_rope, k_nope, k_rope, v, step.cu_q, step.cu_k, step.max_q,
                    self.backend.softmax_scale, out=out)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, qk={self.nope}+{self.rope}, v={self.v_dim}, layer={self.layer_idx}"
