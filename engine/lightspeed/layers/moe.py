"""Mixture-of-experts feed-forward: top-k routing and fused expert GEMMs.

Expert weights are stacked: `w13 [E_local, 2·I_local, H]` (gate ‖ up of every expert) and
`w2 [E_local, H, I_local]`. Three layouts over the MoE group (`ParallelLayout`):
- tensor parallel: every rank holds a slice of every expert's intermediate dimension
  (Replicate → Partial, reduced at the next boundary);
- expert parallel, replicated tokens: every rank holds `E / ep` whole experts and sees every token
  of its attention group; ids of other ranks' experts become -1 (skipped by the kernel), so the
  output is Partial and reduced exactly like the tensor-parallel one;
- expert parallel, token shards (data-parallel attention, sequence parallelism): every rank holds
  distinct tokens, sent to the ranks of their experts and back by all-to-all
  (`expert_parallel.py`); Shard(0) → Shard(0).

Routing covers Qwen-style softmax top-k and DeepSeek's: sigmoid scores, a correction bias that
steers the choice only (`noaux_tc`), grouped top-k, and a scaling factor on the routed weights.
How the experts multiply is the layer's `scheme` (FP8 block-scaled experts: layers.quantization).
"""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .expert_parallel import exchange_tokens
from .parallel import ParallelContext, Partial, Replicate, Shard, redistribute


class UnquantizedExperts:
    """Default scheme: `moe/fused_experts` over full-precision expert weights."""

    @staticmethod
    def apply(layer: FusedMoE, x, topk_weights, topk_ids) -> torch.Tensor:
        return ops.fused_experts(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, activation="silu")


class MoEGate(nn.Module):
    """Router logits in fp32 (`weight [E, H]` fp32 whatever the model dtype: routing decisions are
    sensitive to rounding), and DeepSeek-V3's `e_score_correction_bias [E]` when `correction_bias`."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=torch.float32), requires_grad=False)
        self.weight.weight_loader = _copy_cast
        if correction_bias:
            self.e_score_correction_bias = nn.Parameter(torch.empty(num_experts, dtype=torch.float32),
                                                        requires_grad=False)
            self.e_score_correction_bias.weight_loader = _copy_cast
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> fp32 [T, E]
        return ops.linear(x.float(), self.weight)


def _copy_cast(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"MoE gate: checkpoint shape {tuple(loaded.shape)} != parameter shape {tuple(param.shape)}")
    param.data.copy_(loaded)  # a bf16 checkpoint gate becomes fp32


class FusedMoE(nn.Module):
    """forward(x [T, H], router_logits [T, E]) -> [T, H].

    Checkpoint tensors load per expert (`shard_id` "w1" gate, "w3" up, "w2" down, with a global
    `expert_id`; experts of other ranks are skipped) or stacked for all experts at once
    (`expert_id=None`, "w13" [E, 2I, H] / "w2"). `expert_load [E]` counts the tokens routed to
    each expert (real tokens only, as far as `step_tokens` tells them apart from padding).
    """

    scheme = UnquantizedExperts()  # how the experts multiply (layers.quantization: FP8 blocks)
    step_tokens = None  # placement.StepTokens of the model, wired by the placement compiler
    step_tokens_shard = None  # the group the residual stream's tokens are sharded over, if they are

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool = True, scoring: str = "softmax", reduce_results: bool = True,
                 parallel: ParallelContext | None = None, *, num_groups: int | None = None,
                 topk_groups: int | None = None, routed_scaling_factor: float = 1.0,
                 expert_parallel: bool = False, tokens_sharded: bool = False):
        super().__init__()
        self.parallel = parallel or ParallelContext()
        self.num_experts, self.top_k = num_experts, top_k
        self.renormalize, self.scoring = renormalize, scoring
        self.num_groups, self.topk_groups = num_groups or None, topk_groups or None
        self.routed_scaling_factor = routed_scaling_factor
        self.expert_parallel = expert_parallel and self.parallel.tp_size > 1
        if self.expert_parallel:
            self.num_local_experts = self.parallel.divide(num_experts, "MoE experts")
            self.intermediate_local = intermediate_size
        else:
            self.num_local_experts = num_experts
            self.intermediate_local = self.parallel.divide(intermediate_size, "MoE intermediate size")
        self.expert_start = self.parallel.tp_rank * self.num_local_experts if self.expert_parallel else 0
        if tokens_sharded and not self.expert_parallel:
            raise ValueError("MoE layers take token shards only under expert parallelism")
        self.tokens_sharded = tokens_sharded
        self.input_placement = Shard(0) if tokens_sharded else Replicate()
        if tokens_sharded:
            self.output_placement = Shard(0)
        else:
            self.output_placement = Replicate() if reduce_results else Partial()
        e_local, i_local = self.num_local_experts, self.intermediate_local
        self.w13_weight = nn.Parameter(torch.empty(e_local, 2 * i_local, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(e_local, hidden_size, i_local), requires_grad=False)
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader
        self.register_buffer("expert_load", torch.zeros(num_experts, dtype=torch.int64), persistent=False)

    def _rank_slice(self, loaded: torch.Tensor, dim: int, size: int) -> torch.Tensor:
        if self.expert_parallel:
            return loaded  # whole experts: the intermediate dimension is not split
        return loaded.narrow(dim, self.parallel.tp_rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str,
                      expert_id: int | None = None) -> None:
        if expert_id is None:  # stacked over every expert: keep this rank's
            loaded = loaded.narrow(0, self.expert_start, self.num_local_experts)
            target = param.data
        else:
            local = expert_id - self.expert_start
            if not 0 <= local < self.num_local_experts:
                return  # another rank's expert
            target = param.data[local]
        # The intermediate extent of this parameter: weight rows, or 128-blocks for FP8 block scales.
        i_local = param.shape[-2] // 2 if shard_id in ("w13", "w1", "w3") else param.shape[-1]
        # Per expert `loaded` is [2I | I, H] or [H, I]; stacked it has a leading [E]: index from the end.
        if shard_id == "w13":
            gate, up = loaded.chunk(2, dim=-2)
            loaded_local = torch.cat([self._rank_slice(gate, -2, i_local), self._rank_slice(up, -2, i_local)], dim=-2)
        elif shard_id in ("w1", "w3"):
            target = target.narrow(-2, 0 if shard_id == "w1" else i_local, i_local)
            loaded_local = self._rank_slice(loaded, -2, i_local)
        elif shard_id == "w2":
            loaded_local = self._rank_slice(loaded, -1, i_local)
        else:
            raise ValueError(f"FusedMoE shard_id must be w1, w3, w13 or w2, got {shard_id!r}")
        if target.shape != loaded_local.shape:
            raise ValueError(f"FusedMoE[{shard_id}, expert {expert_id}]: checkpoint shape "
                             f"{tuple(loaded.shape)} does not fit parameter {tuple(target.shape)}")
        target.copy_(loaded_local)

    def local_ids(self, topk_ids: torch.Tensor, rank: int | None = None) -> torch.Tensor:
        """Global expert ids -> ids into the experts of `rank` (default: this one), -1 for others'."""
        start = self.expert_start if rank is None else rank * self.num_local_experts
        local = topk_ids - start
        return torch.where((local >= 0) & (local < self.num_local_experts), local, -1).to(torch.int32)

    def apply_experts(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """This rank's experts over `x [N, H]` with local ids `[N, k]` (-1: skipped) -> `[N, H]`."""
        return self.scheme.apply(self, x, topk_weights, topk_ids)

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor,
                correction_bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H], router_logits [T, E] (fp32 for DeepSeek), correction_bias [E] or None -> [T, H]."""
        topk_weights, topk_ids = ops.moe_topk(
            router_logits, self.top_k, scoring=self.scoring, renormalize=self.renormalize,
            correction_bias=correction_bias, num_groups=self.num_groups, topk_groups=self.topk_groups,
            routed_scaling_factor=self.routed_scaling_factor)
        valid = self._count_load(topk_ids)
        if self.tokens_sharded:
            return exchange_tokens(self, x, topk_weights, topk_ids, valid)
        if self.expert_parallel:
            topk_ids = self.local_ids(topk_ids)
        y = self.apply_experts(x, topk_weights, topk_ids)
        return redistribute(y, Partial(), self.output_placement, self.parallel)

    def _count_load(self, topk_ids: torch.Tensor) -> torch.Tensor | None:
        """Add this step's routing to `expert_load`; returns the real-token mask it used (or None)."""
        valid = None
        if self.step_tokens is not None:
            shard = self.step_tokens_shard if self.tokens_sharded else None
            valid = self.step_tokens.valid_rows(shard)
        ids = topk_ids.reshape(-1).long()
        if valid is not None and valid.shape[0] == topk_ids.shape[0]:
            counts = valid.to(torch.int64).repeat_interleave(topk_ids.shape[1])
        else:
            counts, valid = torch.ones_like(ids), None
        self.expert_load.scatter_add_(0, ids, counts)
        return valid

    def extra_repr(self) -> str:
        kind = "ep" if self.expert_parallel else "tp"
        return (f"experts={self.num_local_experts}/{self.num_experts}, top_k={self.top_k}, "
                f"intermediate_local={self.intermediate_local}, {kind}={self.parallel.tp_size}"
                f"{', token shards' if self.tokens_sharded else ''}")
