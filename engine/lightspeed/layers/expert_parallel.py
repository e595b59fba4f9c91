"""Token dispatch and combine of expert-parallel MoE layers whose ranks hold distinct tokens.

Design note. Under data-parallel attention (or sequence parallelism) every rank of the MoE group
holds different tokens, and expert e lives on rank `e // E_local`. Two ways to bring tokens to
their experts and the results back:
- `all_to_all` (eager steps): one row per (token, destination rank holding at least one of its
  experts), grouped by destination, sent with `all_to_all_single` together with the token's
  routing restricted to that rank's experts (other ids -1, skipped by the kernel); the results come
  back by the reverse all-to-all and are summed per token in fp32. Only the rows that need a rank
  travel, but the split sizes must be on the host: one small host sync per MoE layer (DeepEP's
  normal mode has the same).
- `gather_scatter` (CUDA-graph capture: no host sync, fixed shapes): every rank all-gathers the
  group's token shards and routing, runs its experts over all of them (others' ids -1) and a
  reduce-scatter returns each rank the sum for its own tokens. Same bytes as an all-reduce.
DeepEP-style kernels (exact sizes without a host sync) are the registry candidate for both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from .parallel import all_gather_rows, reduce_scatter_rows

if TYPE_CHECKING:
    from .moe import FusedMoE


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def exchange_tokens(moe: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    valid: torch.Tensor | None) -> torch.Tensor:
    """MoE output `[C, H]` of this rank's tokens `x [C, H]` routed to global experts `topk_ids [C, k]`
    with `topk_weights [C, k]`; rows where `valid` is False (padding) are sent nowhere."""
    if _capturing(x.device):
        return gather_scatter(moe, x, topk_weights, topk_ids, valid)
    return all_to_all(moe, x, topk_weights, topk_ids, valid)


def all_to_all(moe: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               valid: torch.Tensor | None) -> torch.Tensor:
    ep, local_experts = moe.parallel, moe.num_local_experts
    group, top_k = ep.group, topk_ids.shape[1]
    # need[t, r]: token t has at least one expert on rank r
    need = torch.zeros(x.shape[0], ep.tp_size, dtype=torch.bool, device=x.device)
    need.scatter_(1, topk_ids.long() // local_experts, True)
    if valid is not None:
        need &= valid[:, None]
    dest, token = need.t().nonzero(as_tuple=True)  # [S]: grouped by destination rank, in token order
    send_counts = need.sum(dim=0)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()  # the layer's one host sync
    ids = topk_ids[token].long() - dest[:, None] * local_experts
    ids = torch.where((ids >= 0) & (ids < local_experts), ids, -1)
    # Routing of each row as one fp32 tensor: its ids on the destination rank (exact below 2^24) ‖ weights.
    routing = torch.cat([ids.to(torch.float32), topk_weights[token].to(torch.float32)], dim=1)  # [S, 2k]
    num_recv = sum(recv_splits)
    recv_rows = x.new_empty(num_recv, x.shape[1])
    dist.all_to_all_single(recv_rows, x[token].contiguous(), recv_splits, send_splits, group=group)
    recv_routing = routing.new_empty(num_recv, 2 * top_k)
    dist.all_to_all_single(recv_routing, routing, recv_splits, send_splits, group=group)
    out_rows = moe.apply_experts(recv_rows, recv_routing[:, top_k:].contiguous(),
                                 recv_routing[:, :top_k].to(torch.int32))
    back = x.new_empty(token.shape[0], x.shape[1])
    dist.all_to_all_single(back, out_rows.contiguous(), send_splits, recv_splits, group=group)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return out.index_add_(0, token, back.float()).to(x.dtype)


def gather_scatter(moe: FusedMoE, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                   valid: torch.Tensor | None) -> torch.Tensor:
    """Every rank pads its rows to the step's shard size (`StepTokens.rows_per_rank`, equal on all
    ranks of the group once data-parallel ranks agree on `pad_to`), so the collectives have fixed shapes."""
    ep, num_rows = moe.parallel, x.shape[0]
    if valid is not None:
        topk_ids = torch.where(valid[:, None], topk_ids, -1)
    tokens, shard = moe.step_tokens, moe.step_tokens_shard
    rows = tokens.rows_per_rank(shard.tp_size if shard is not None else 1) if tokens is not None else num_rows
    if rows > num_rows:  # padding rows route nowhere
        x = torch.cat([x, x.new_zeros(rows - num_rows, x.shape[1])])
        topk_ids = torch.cat([topk_ids, topk_ids.new_full((rows - num_rows, topk_ids.shape[1]), -1)])
        topk_weights = torch.cat([topk_weights, topk_weights.new_zeros(rows - num_rows, topk_weights.shape[1])])
    gathered = all_gather_rows(x, ep)  # [n·C, H]
    ids = moe.local_ids(all_gather_rows(topk_ids.to(torch.int32), ep))
    weights = all_gather_rows(topk_weights.to(torch.float32), ep)
    return reduce_scatter_rows(moe.apply_experts(gathered, weights, ids), ep)[:num_rows]
