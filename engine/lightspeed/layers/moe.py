"""Mixture-of-experts feed-forward: top-k routing and fused expert GEMMs.

Expert weights are stacked: `w13 [E, 2·I_local, H]` (gate ‖ up of every expert) and
`w2 [E, H, I_local]`. Under tensor parallelism each rank holds a slice of every expert's
intermediate dimension (Replicate → Partial, then all-reduced). Expert parallelism (whole
experts per rank) would be another layer type with the same loader interface.

Routing covers Qwen-style softmax top-k and DeepSeek's: sigmoid scores, a correction bias that
steers the choice only (`noaux_tc`), grouped top-k, and a scaling factor on the routed weights.
How the experts multiply is the layer's `scheme` (FP8 block-scaled experts: layers.quantization).
"""

from __future__ import annotations

import torch
from lightspeed_kernel import ops
from torch import nn

from .parallel import ParallelContext, Partial, Replicate, redistribute


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

    Checkpoint tensors load per expert (`shard_id` "w1" gate, "w3" up, "w2" down, with
    `expert_id`) or stacked for all experts at once (`expert_id=None`, "w13" [E, 2I, H] / "w2").
    """

    input_placement = Replicate()

    scheme = UnquantizedExperts()  # how the experts multiply (layers.quantization: FP8 blocks)

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool = True, scoring: str = "softmax", reduce_results: bool = True,
                 parallel: ParallelContext | None = None, *, num_groups: int | None = None,
                 topk_groups: int | None = None, routed_scaling_factor: float = 1.0):
        super().__init__()
        self.parallel = parallel or ParallelContext()
        self.num_experts, self.top_k = num_experts, top_k
        self.renormalize, self.scoring = renormalize, scoring
        self.num_groups, self.topk_groups = num_groups or None, topk_groups or None
        self.routed_scaling_factor = routed_scaling_factor
        self.intermediate_local = self.parallel.divide(intermediate_size, "MoE intermediate size")
        self.output_placement = Replicate() if reduce_results else Partial()
        i_local = self.intermediate_local
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * i_local, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, i_local), requires_grad=False)
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader

    def _rank_slice(self, loaded: torch.Tensor, dim: int, size: int) -> torch.Tensor:
        return loaded.narrow(dim, self.parallel.tp_rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str,
                      expert_id: int | None = None) -> None:
        # The intermediate extent of this parameter: weight rows, or 128-blocks for FP8 block scales.
        i_local = param.shape[-2] // 2 if shard_id in ("w13", "w1", "w3") else param.shape[-1]
        target = param.data if expert_id is None else param.data[expert_id]
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

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor,
                correction_bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, H], router_logits [T, E] (fp32 for DeepSeek), correction_bias [E] or None -> [T, H]."""
        topk_weights, topk_ids = ops.moe_topk(
            router_logits, self.top_k, scoring=self.scoring, renormalize=self.renormalize,
            correction_bias=correction_bias, num_groups=self.num_groups, topk_groups=self.topk_groups,
            routed_scaling_factor=self.routed_scaling_factor)
        y = self.scheme.apply(self, x, topk_weights, topk_ids)
        return redistribute(y, Partial(), self.output_placement, self.parallel)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, top_k={self.top_k}, intermediate_local={self.intermediate_local}, "
                f"tp={self.parallel.tp_size}")
