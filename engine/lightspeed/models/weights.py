"""Routing checkpoint tensors (HF names) onto fused / sharded parameters."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import nn

from ..layers.linear import default_weight_loader
from ..layers.weight_only import named_weights

# (fused parameter name part, checkpoint name part, shard id) shared by Llama-style models.
LLAMA_STACKED_PARAMS: tuple[tuple[str, str, object], ...] = (
    (".qkv_proj.", ".q_proj.", "q"),
    (".qkv_proj.", ".k_proj.", "k"),
    (".qkv_proj.", ".v_proj.", "v"),
    (".gate_up_proj.", ".gate_proj.", 0),
    (".gate_up_proj.", ".up_proj.", 1),
)

# Checkpoint entries that are derived state, not weights.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_stacked_weights(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                         stacked: Sequence[tuple[str, str, object]] = LLAMA_STACKED_PARAMS,
                         tied_lm_head: bool = False) -> set[str]:
    """Copy every `(hf_name, tensor)` into `module`'s parameters; returns the parameter names set.

    A name containing a `stacked` checkpoint part is loaded into the fused parameter with its
    shard id; anything else must match a parameter name exactly. An unknown name is an error.
    Quantised weights (layers/weight_only.py) load like parameters.
    """
    params = named_weights(module)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES) or (tied_lm_head and name == "lm_head.weight"):
            continue
        target, shard_id = target_of(name, stacked)
        param = _param(params, target, name)
        if shard_id is not None:
            param.weight_loader(param, tensor, shard_id)
        else:
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        loaded.add(target)
    return loaded


def target_of(ckpt_name: str, stacked: Sequence[tuple[str, str, object]] = LLAMA_STACKED_PARAMS) -> tuple[str, object]:
    """(model parameter name, shard id or None) that checkpoint tensor `ckpt_name` loads into."""
    for param_part, ckpt_part, shard_id in stacked:
        if ckpt_part in ckpt_name:
            return ckpt_name.replace(ckpt_part, param_part), shard_id
    return ckpt_name, None


def _param(params: dict[str, nn.Parameter], target: str, ckpt_name: str) -> nn.Parameter:
    try:
        return params[target]
    except KeyError:
        raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no model parameter") from None


# Experts one by one (checkpoints; FP8 ones carry a block scale per weight) or stacked (transformers 5 in memory).
_PER_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|weight_scale_inv)$")
_STACKED_EXPERTS = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_SHARD_OF = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2", "gate_up_proj": "w13"}


def route_expert_weights(params: dict[str, nn.Parameter], weights: Iterable[tuple[str, torch.Tensor]],
                         loaded: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Load expert tensors into `FusedMoE` parameters (`w13_weight`, `w2_weight` and their
    `_scale_inv` block scales), adding the names to `loaded`; yield every other tensor."""
    for name, tensor in weights:
        per_expert = _PER_EXPERT.match(name)
        stacked = None if per_expert else _STACKED_EXPERTS.match(name)
        if per_expert is None and stacked is None:
            yield name, tensor
            continue
        if per_expert:
            prefix, expert_id, proj, suffix = per_expert.group(1), int(per_expert.group(2)), *per_expert.groups()[2:]
        else:
            prefix, expert_id, proj, suffix = stacked.group(1), None, stacked.group(2), "weight"
        target = f"{prefix}.{'w2' if proj == 'down_proj' else 'w13'}_{suffix}"
        if target not in params:
            raise ValueError(f"checkpoint tensor {name!r} matches no model parameter")
        params[target].weight_loader(params[target], tensor, _SHARD_OF[proj], expert_id)
        loaded.add(target)
