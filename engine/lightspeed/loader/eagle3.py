"""Load an EAGLE-3 draft head (a Hugging Face folder: config.json + safetensors) for a loaded target."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from .loader import _default_dtype, finish_loading, init_dummy_weights
from .safetensors_weights import iterate_safetensors


def load_eagle3(path: str | Path, target: nn.Module, *, load_format: str = "auto", seed: int = 0,
                progress: bool = False) -> nn.Module:
    """The head of folder `path` over `target` (a Llama-family model, already loaded), on its device
    and dtype, caching into KV layer `target.config.num_hidden_layers`; random weights with
    load_format="dummy". ValueError (a start-up error) when it cannot draft for this target."""
    from ..models.llama_eagle3 import Eagle3Config, Eagle3Head

    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"EAGLE-3 head {path}: no config.json there")
    config = Eagle3Config.from_hf_dict(json.loads(config_file.read_text()), str(path))
    main = target.config
    if main.mla is not None or not hasattr(getattr(target, "model", None), "aux_hidden_layers"):
        raise ValueError(f"EAGLE-3 drafts for Llama-family models; the target is {main.architecture}")
    if config.vocab_size != main.vocab_size:
        raise ValueError(f"EAGLE-3 head {path}: its vocabulary ({config.vocab_size} tokens) differs from the "
                         f"target model's ({main.vocab_size}): it was trained for another model")
    if config.hidden_size != main.hidden_size:
        raise ValueError(f"EAGLE-3 head {path}: hidden_size {config.hidden_size} != the target's {main.hidden_size}")
    if (config.num_key_value_heads, config.head_dim) != (main.num_key_value_heads, main.head_dim):
        raise ValueError(f"EAGLE-3 head {path}: its KV shape ({config.num_key_value_heads} heads x {config.head_dim}) "
                         f"differs from the target's ({main.num_key_value_heads} x {main.head_dim}), which the "
                         f"shared KV pool needs")
    layers = main.num_hidden_layers
    # vLLM's default, clamped so that shallow (test) targets have the three layers too.
    aux = config.aux_layers or (min(2, layers - 1), layers // 2, max(layers - 3, 0))
    if len(aux) != 3 or not all(0 <= i < layers for i in aux):
        raise ValueError(f"EAGLE-3 head {path}: needs three target layers in [0, {layers}), got {aux}")
    weight = target.model.embed_tokens.weight
    with torch.device(weight.device), _default_dtype(weight.dtype):
        head = Eagle3Head(config, target, layer_idx=layers)
    files = sorted(folder.glob("*.safetensors"))
    if load_format == "dummy":
        init_dummy_weights(head, seed)
    elif files:
        loaded = head.load_weights(iterate_safetensors(files, None, progress))
        missing = sorted(set(dict(head.named_parameters())) - loaded)
        if missing:
            raise ValueError(f"EAGLE-3 head {path}: checkpoint lacks {missing[0]}"
                             f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}")
    else:
        raise ValueError(f"EAGLE-3 head {path}: no *.safetensors files (use load_format dummy for random weights)")
    finish_loading(head)
    target.model.aux_hidden_layers = tuple(aux)
    return head.eval()
