"""Mixture-of-experts references: router top-k (softmax / sigmoid, DeepSeek grouped top-k with a
correction bias) and the experts themselves as a loop over the experts that received tokens."""

from __future__ import annotations

import torch

from ._register import reference
from .activation import gelu_and_mul, silu_and_mul


@reference("moe", "topk")
def moe_topk(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    correction_bias: torch.Tensor | None = None,
    num_groups: int | None = None,
    topk_groups: int | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    # router_logits: [T, E] -> (weights fp32 [T, k], expert ids int32 [T, k])
    # The bias (DeepSeek-V3 "noaux_tc") only steers which experts are chosen; the weights are the
    # unbiased scores of the chosen experts. Grouped top-k keeps the `topk_groups` best of
    # `num_groups` expert groups (group score: top-2 sum of biased scores with a bias, else max).
    num_tokens, num_experts = router_logits.shape
    logits = router_logits.float()
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if num_groups:
        if num_experts % num_groups or not topk_groups:
            raise ValueError(f"grouped top-k: {num_experts} experts, {num_groups} groups, {topk_groups} kept")
        grouped = choice.view(num_tokens, num_groups, num_experts // num_groups)
        if correction_bias is None:
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)
        keep_groups = group_scores.topk(topk_groups, dim=-1).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep_groups, True)
        expert_mask = group_mask.repeat_interleave(num_experts // num_groups, dim=1)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=1e-20)
    weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)


def _activation(name: str):
    if name == "silu":
        return silu_and_mul
    if name == "gelu":
        return gelu_and_mul
    raise ValueError(f"activation must be 'silu' or 'gelu', got {name!r}")


def _route(x: torch.Tensor, num_experts: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor, expert_mlp):
    """sum_k w_k * expert_mlp(e_k, x[tokens of e_k]) in fp32, one expert at a time -> [T, H] fp32."""
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    # Ids < 0 name no expert of this rank (expert parallelism): they sort first and are skipped.
    flat_ids = topk_ids.reshape(-1).long().clamp(min=-1)
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids + 1, minlength=num_experts + 1).tolist()
    start = counts[0]
    for expert, count in enumerate(counts[1:]):
        if count == 0:
            continue
        picks = order[start : start + count]
        start += count
        tokens = picks // top_k
        expert_out = expert_mlp(expert, x[tokens]).float()  # [n, H]
        out.index_add_(0, tokens, expert_out * topk_weights.reshape(-1)[picks, None].float())
    return out


@reference("moe", "fused_experts")
def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
) -> torch.Tensor:
    # x: [T, H]; w13: [E, 2I, H] (gate rows then up rows); w2: [E, H, I];
    # topk_weights: [T, k]; topk_ids: [T, k] -> [T, H] = sum_k w_k * w2_e(act(gate) * up)
    act = _activation(activation)

    def mlp(e: int, xs: torch.Tensor) -> torch.Tensor:
        return act(xs @ w13[e].t()) @ w2[e].t()  # hidden [n, I] in x's dtype

    return _route(x, w13.shape[0], topk_weights, topk_ids, mlp).to(x.dtype)


def _fp8_block_matmul(a: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    # a: [n, K] float -> per-(token, 128 columns) e4m3 activations, then a · (w·w_scale)^T in fp32
    from .gemm import fp8_block_gemm
    from .quantize import quant_fp8_per_block

    q, q_scale = quant_fp8_per_block(a)
    return fp8_block_gemm(q, q_scale, w, w_scale, out_dtype=out_dtype)


@reference("moe", "fused_experts_fp8")
def fused_experts_fp8(
    x: torch.Tensor,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
) -> torch.Tensor:
    # x: [T, H]; w13: e4m3 [E, 2I, H] with w13_scale fp32 [E, ceil(2I/128), ceil(H/128)];
    # w2: e4m3 [E, H, I] with w2_scale [E, ceil(H/128), ceil(I/128)] -> [T, H] in x's dtype.
    # Activations are quantised per token and 128 columns before each GEMM (DeepSeek-V3's recipe);
    # each GEMM output is rounded to x's dtype, as in `fused_experts`.
    act = _activation(activation)

    def mlp(e: int, xs: torch.Tensor) -> torch.Tensor:
        hidden = act(_fp8_block_matmul(xs, w13[e], w13_scale[e], x.dtype))  # [n, I]
        return _fp8_block_matmul(hidden, w2[e], w2_scale[e], x.dtype)

    return _route(x, w13.shape[0], topk_weights, topk_ids, mlp).to(x.dtype)
