"""Routing checkpoint tensors (HF names) onto fused / sharded parameters."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from ..layers.linear import default_weight_loader

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
    """
    params = dict(module.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(IGNORED_SUFFIXES) or (tied_lm_head and name == "lm_head.weight"):
            continue
        for param_part, ckpt_part, shard_id in stacked:
            if ckpt_part in name:
                target = name.replace(ckpt_part, param_part)
                param = _param(params, target, name)
                param.weight_loader(param, tensor, shard_id)
                break
        else:
            target = name
            param = _param(params, target, name)
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        loaded.add(target)
    return loaded


def _param(params: dict[str, nn.Parameter], target: str, ckpt_name: str) -> nn.Parameter:
    try:
        return params[target]
    except KeyError:
        raise ValueError(f"checkpoint tensor {ckpt_name!r} matches no model parameter") from None
