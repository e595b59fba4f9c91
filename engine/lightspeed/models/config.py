"""`ModelConfig`: the architecture facts the engine needs, parsed once from a HF config.

Accepts both transformers 4 (`rope_theta`, `rope_scaling`, `torch_dtype`, `num_experts`) and
transformers 5 (`rope_parameters`, `dtype`, `num_local_experts`) spellings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .config_deepseek import (
    MLA_MODEL_TYPES,
    MLAConfig,
    QuantizationConfig,
    deepseek_fields,
    parse_quantization,
)

# model_type -> architecture, for configs that omit `architectures`.
_ARCH_BY_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
}


@dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer (one HF `config.json`)."""

    architecture: str  # HF `architectures[0]`, the model registry key
    model_type: str  # HF `model_type`
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # HF rope_scaling dict with a `rope_type` key (linear, llama3, yarn, ...); None = plain RoPE.
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (and o for Llama-style models)
    mlp_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # generation_config.json's when present, else config.json's
    pad_token_id: int | None = None
    num_experts: int = 0  # 0 = dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k routing weights
    decoder_sparse_step: int = 1  # every n-th layer is MoE
    mlp_only_layers: tuple[int, ...] = ()  # layers that stay dense
    # DeepSeekMoE routing (DeepSeek-V2/V3, Kimi-K2); the defaults are plain softmax top-k.
    scoring_func: str = "softmax"  # router score: softmax or sigmoid
    topk_method: str = "greedy"  # greedy, group_limited_greedy (V2), noaux_tc (V3: + e_score_correction_bias)
    n_group: int = 0  # expert groups of grouped top-k (0 = not grouped)
    topk_group: int = 0  # groups a token may route to
    routed_scaling_factor: float = 1.0  # multiplies the routed experts' weights
    n_shared_experts: int = 0  # always-on experts, one MLP of n_shared_experts * moe_intermediate_size
    # Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2); None = multi-head / grouped-query attention.
    mla: MLAConfig | None = None
    num_nextn_predict_layers: int = 0  # multi-token-prediction modules after the last layer (DeepSeek-V3)
    # Weight quantisation: the checkpoint's `quantization_config`, or --quantization; None = unquantised.
    quantization: QuantizationConfig | None = None
    torch_dtype: torch.dtype = torch.bfloat16  # the checkpoint's dtype ("auto" loads in it)
    name: str = ""  # where it came from: a path or a preset name

    def __post_init__(self) -> None:
        for attr in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "intermediate_size", "max_position_embeddings"):
            if getattr(self, attr) <= 0:
                raise ValueError(f"model config {self.name!r}: {attr} must be positive, got {getattr(self, attr)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"model config {self.name!r}: {self.num_attention_heads} attention heads are not a "
                             f"multiple of {self.num_key_value_heads} key/value heads")
        if self.hidden_act != "silu":
            raise ValueError(f"model config {self.name!r}: activation {self.hidden_act!r} is not supported (silu)")
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"model config {self.name!r}: num_experts_per_tok must be in [1, {self.num_experts}]")
        if self.num_experts and self.moe_intermediate_size <= 0:
            raise ValueError(f"model config {self.name!r}: MoE model without moe_intermediate_size")
        if self.quantization is not None and self.quantization.from_checkpoint:
            block = self.quantization.weight_block_size[0]
            # A checkpoint scales gate and up separately; fused, their blocks must not straddle.
            for attr in ("intermediate_size", "moe_intermediate_size"):
                if getattr(self, attr) % block:
                    raise ValueError(f"model config {self.name!r}: {attr}={getattr(self, attr)} is not a multiple "
                                     f"of the FP8 weight block {block} (quantization_config.weight_block_size)")
        if self.topk_method == "noaux_tc" and self.num_experts and not self.n_group:
            raise ValueError(f"model config {self.name!r}: topk_method='noaux_tc' needs n_group and topk_group")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (self.is_moe and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    def num_kv_heads_per_rank(self, tp_size: int = 1, tp_rank: int = 0) -> int:
        """KV heads tensor-parallel rank `tp_rank` caches: whole heads split as evenly as possible
        (the first ranks take one more when they do not divide), one replicated head when there are
        fewer heads than ranks (see `layers.QKVParallelLinear`)."""
        from ..layers.parallel import split_sizes

        if self.num_key_value_heads < tp_size:
            return 1
        return split_sizes(self.num_key_value_heads, tp_size)[tp_rank]

    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None,
                     name: str = "") -> ModelConfig:
        """Parse a HF `config.json` dict (and optionally `generation_config.json`)."""
        hf = dict(hf.get("text_config") or hf) if "text_config" in hf and "hidden_size" not in hf else dict(hf)
        model_type = hf.get("model_type", "")
        archs = hf.get("architectures") or [_ARCH_BY_MODEL_TYPE.get(model_type, "")]
        if not archs[0]:
            raise ValueError(f"model config {name!r}: neither `architectures` nor a known `model_type`")
        if hf.get("use_sliding_window"):
            raise ValueError(f"model config {name!r}: sliding-window attention is not supported")
        try:
            hidden, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
            rope_params = dict(hf.get("rope_parameters") or {})
            num_experts = int(hf.get("num_experts") or hf.get("num_local_experts") or 0)
            eos = (generation_config or {}).get("eos_token_id", hf.get("eos_token_id"))
            fields = dict(
                architecture=archs[0],
                model_type=model_type,
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden,
                num_hidden_layers=int(hf["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(hf.get("num_key_value_heads") or heads),
                head_dim=int(hf.get("head_dim") or hidden // heads),
                intermediate_size=int(hf["intermediate_size"]),
                max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                rope_theta=float(hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))),
                rope_scaling=_rope_scaling(hf.get("rope_scaling") or rope_params),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases (and never an o_proj bias); its config has no flag.
                attention_bias=bool(hf.get("attention_bias", False)) or model_type == "qwen2",
                mlp_bias=bool(hf.get("mlp_bias", False)),
                hidden_act=hf.get("hidden_act", "silu"),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=_int_tuple(eos),
                pad_token_id=hf.get("pad_token_id"),
                num_experts=num_experts,
                num_experts_per_tok=int(hf.get("num_experts_per_tok") or 0) if num_experts else 0,
                moe_intermediate_size=int(hf.get("moe_intermediate_size") or 0),
                norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
                decoder_sparse_step=int(hf.get("decoder_sparse_step") or 1),
                mlp_only_layers=_int_tuple(hf.get("mlp_only_layers")),
                quantization=parse_quantization(hf.get("quantization_config"), name),
                torch_dtype=_dtype(hf.get("torch_dtype") or hf.get("dtype") or "float32"),
                name=name,
            )
            if model_type in MLA_MODEL_TYPES:  # DeepSeek-V2/V3, Kimi-K2: MLA + DeepSeekMoE fields
                fields.update(deepseek_fields(hf, name))
            return cls(**fields)
        except KeyError as e:
            raise ValueError(f"model config {name!r} lacks required field {e.args[0]!r}") from None

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read `config.json` (and `generation_config.json` beside it) from a HF model directory."""
        path = Path(path)
        config_path = path / "config.json" if path.is_dir() else path
        try:
            hf = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read model config {config_path}: {e}") from None
        gen_path = config_path.with_name("generation_config.json")
        gen = None
        if gen_path.is_file():
            try:
                gen = json.loads(gen_path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"cannot parse {gen_path}: {e}") from None
        return cls.from_hf_dict(hf, gen, name=str(path))


def _rope_scaling(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not raw:
        return None
    scaling = {k: v for k, v in raw.items() if k != "rope_theta"}
    rope_type = scaling.pop("type", None)
    scaling.setdefault("rope_type", rope_type or "default")
    return None if scaling["rope_type"] == "default" else scaling


def _int_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(dict.fromkeys(int(v) for v in value))


def _dtype(name) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r} in model config")
    return dtype
