"""Mixture-of-experts ops (family ``moe``). Dispatch dtype: ``router_logits.dtype`` / ``x.dtype``."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


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
    """Route each token to ``top_k`` experts (moe/topk).

    router_logits: [T, E]. ``scoring`` "softmax" or "sigmoid"; ``correction_bias`` [E] steers the
    choice only (DeepSeek-V3); ``num_groups``/``topk_groups`` restrict the choice to the best
    groups (grouped top-k); weights are renormalised to sum 1 when ``renormalize``, then multiplied
    by ``routed_scaling_factor``. Returns (weights fp32 [T, k], expert ids int32 [T, k]).
    """
    return impl_for("moe", "topk", router_logits)(
        router_logits, top_k, scoring=scoring, renormalize=renormalize, correction_bias=correction_bias,
        num_groups=num_groups, topk_groups=topk_groups, routed_scaling_factor=routed_scaling_factor,
    )  # fmt: skip


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
) -> torch.Tensor:
    """``sum_k weight_k · w2[e_k] @ act_and_mul(w13[e_k] @ x)`` (moe/fused_experts).

    x: [T, H]; w13: [E, 2I, H] (gate rows, then up rows); w2: [E, H, I]; topk_weights: [T, k];
    topk_ids: [T, k] int32; activation "silu" or "gelu". Returns [T, H] in x's dtype.
    An id < 0 names no expert (expert parallelism: one held by another rank): it adds nothing.
    """
    return impl_for("moe", "fused_experts", x)(x, w13, w2, topk_weights, topk_ids, activation=activation)


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
    """:func:`fused_experts` over FP8 block-scaled experts (moe/fused_experts_fp8, DeepSeek-V3 style).

    w13: e4m3 [E, 2I, H] with w13_scale fp32 [E, ceil(2I/128), ceil(H/128)] (one scale per 128x128
    block: w = e4m3 · scale); w2: e4m3 [E, H, I] with w2_scale [E, ceil(H/128), ceil(I/128)].
    Activations are quantised per token and 128 columns (e4m3, amax/448) before each GEMM.
    Ids < 0 are skipped, as in :func:`fused_experts`.
    x: [T, H] (bf16 / fp16 / fp32); returns [T, H] in x's dtype.
    """
    return impl_for("moe", "fused_experts_fp8", x)(
        x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation=activation
    )
