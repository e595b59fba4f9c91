"""MoE routing: softmax / sigmoid scores, optional correction bias and grouped top-k, one token per
program. Selection follows the reference: the bias only steers the choice, weights are the unbiased
scores of the chosen experts; grouped top-k keeps the best `topk_groups` groups by max score (top-2
sum when a bias is given). Top-k is k rounds of argmax-and-mask, fine for k <= 16 and E <= 1024.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check, register


@triton.jit
def _topk_kernel(
    logits_ptr,
    bias_ptr,
    w_ptr,
    ids_ptr,
    n_experts,
    stride_l,
    top_k,
    num_groups,
    topk_groups,
    scaling,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GROUPED: tl.constexpr,
    RENORM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    emask = e < n_experts
    x = tl.load(logits_ptr + tok * stride_l + e, mask=emask, other=float("-inf")).to(tl.float32)
    if SIGMOID:
        scores = tl.sigmoid(x)
    else:
        ex = tl.exp(x - tl.max(x, axis=0))
        scores = ex / tl.sum(ex, axis=0)
    scores = tl.where(emask, scores, 0.0)
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + e, mask=emask, other=0.0).to(tl.float32)
    choice = tl.where(emask, choice, float("-inf"))
    if GROUPED:
        group_size = n_experts // num_groups
        group_of = e // group_size
        gidx = tl.arange(0, BLOCK_G)
        gscore = tl.full([BLOCK_G], float("-inf"), tl.float32)
        for g in range(0, num_groups):
            in_g = (group_of == g) & emask
            vals = tl.where(in_g, choice, float("-inf"))
            best = tl.max(vals, axis=0)
            if HAS_BIAS:
                # top-2 sum (top-1 for groups of one): drop one occurrence of the max, add the next
                first = tl.argmax(vals, axis=0)
                second = tl.max(tl.where(e == first, float("-inf"), vals), axis=0)
                best = best + tl.where(group_size > 1, second, 0.0)
            gscore = tl.where(gidx == g, best, gscore)
        keep_group = tl.zeros([BLOCK_G], tl.int1)
        for _ in range(0, topk_groups):
            gbest = tl.argmax(gscore, axis=0)
            keep_group = keep_group | (gidx == gbest)
            gscore = tl.where(gidx == gbest, float("-inf"), gscore)
        # expand the group mask to experts: expert e is kept if its group is
        kept = tl.zeros([BLOCK_E], tl.int1)
        for g in range(0, num_groups):
            gk = tl.sum(tl.where((gidx == g) & keep_group, 1, 0), axis=0) > 0
            kept = kept | ((group_of == g) & gk)
        choice = tl.where(kept, choice, float("-inf"))
    kidx = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], tl.float32)
    ids = tl.zeros([BLOCK_K], tl.int32)
    for i in range(0, top_k):
        best = tl.argmax(choice, axis=0)
        w = tl.sum(tl.where(e == best, scores, 0.0), axis=0)
        weights = tl.where(kidx == i, w, weights)
        ids = tl.where(kidx == i, best.to(tl.int32), ids)
        choice = tl.where(e == best, float("-inf"), choice)
    if RENORM:
        weights = weights / tl.maximum(tl.sum(weights, axis=0), 1e-20)
    weights = weights * scaling
    kmask = kidx < top_k
    tl.store(w_ptr + tok * top_k + kidx, weights, mask=kmask)
    tl.store(ids_ptr + tok * top_k + kidx, ids, mask=kmask)


@register("moe", "topk", "triton_moe_topk", FLOAT_DTYPES, features=("grouped", "correction_bias"))
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
):
    """router_logits: [T, E] -> (weights fp32 [T, top_k], expert ids int32 [T, top_k])."""
    check(router_logits.dim() == 2, "router_logits must be [T, E]")
    check(scoring in ("softmax", "sigmoid"), f"scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    t, n_experts = router_logits.shape
    check(1 <= top_k <= n_experts, f"top_k={top_k} must be in 1..{n_experts}")
    check(router_logits.stride(1) == 1, "router_logits rows must be contiguous")
    if num_groups:
        check(
            n_experts % num_groups == 0 and bool(topk_groups),
            f"grouped top-k: {n_experts} experts, {num_groups} groups, {topk_groups} kept",
        )
        check(topk_groups <= num_groups, "topk_groups must be <= num_groups")
    if correction_bias is not None:
        check(correction_bias.shape == (n_experts,), "correction_bias must be [E]")
        correction_bias = correction_bias.contiguous()
    device = router_logits.device
    weights = torch.empty((t, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=device)
    if t == 0:
        return weights, ids
    _topk_kernel[(t,)](
        router_logits,
        correction_bias if correction_bias is not None else router_logits,
        weights,
        ids,
        n_experts,
        router_logits.stride(0),
        int(top_k),
        int(num_groups or 1),
        int(topk_groups or 1),
        float(routed_scaling_factor),
        SIGMOID=scoring == "sigmoid",
        HAS_BIAS=correction_bias is not None,
        GROUPED=bool(num_groups),
        RENORM=bool(renormalize),
        BLOCK_E=triton.next_power_of_2(n_experts),
        BLOCK_G=triton.next_power_of_2(int(num_groups or 1)),
        BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=4,
    )
    return weights, ids
