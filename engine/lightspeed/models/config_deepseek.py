"""DeepSeek-V2/V3 (and Kimi-K2) parts of a model config: multi-head latent attention, DeepSeekMoE
routing, and FP8 block quantisation (`quantization_config`), parsed from HF `config.json` fields.

Every check names the config field at fault: a config the engine cannot run is rejected at load,
never run wrongly. The MLA kernels hold a 512-wide latent and a 64-wide rope key per token
(lightspeed_mla.D_LATENT / D_ROPE); the FP8 kernels use 128x128 weight blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MLA_LATENT_DIM = 512  # lightspeed_mla.D_LATENT
MLA_ROPE_DIM = 64  # lightspeed_mla.D_ROPE
FP8_BLOCK = 128  # gemm/fp8_block and moe/fused_experts_fp8 block edge
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
SCORING_FUNCS = ("softmax", "sigmoid")
QUANTIZATION_METHODS = ("fp8",)  # quantization_config.quant_method values this engine runs

# model_type -> defaults of fields a transformers-saved config may leave out (its class defaults).
_ROUTING_DEFAULTS = {
    "deepseek_v2": {"topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False},
    "deepseek_v3": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True},
    "kimi_k2": {"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True},
}
MLA_MODEL_TYPES = tuple(_ROUTING_DEFAULTS)


@dataclass(frozen=True)
class MLAConfig:
    """Shape of multi-head latent attention (per head unless said otherwise)."""

    q_lora_rank: int | None  # rank of the query down-projection; None = a plain q_proj (V2-Lite)
    kv_lora_rank: int  # width of the compressed KV latent (the cached part), 512
    qk_nope_head_dim: int  # query/key features without position
    qk_rope_head_dim: int  # decoupled rope key/query features, 64, one rope key shared by all heads
    v_head_dim: int
    rope_interleave: bool = True  # rope on interleaved pairs (DeepSeek checkpoints) vs halves

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


@dataclass(frozen=True)
class QuantizationConfig:
    """Weight quantisation of a checkpoint (its `quantization_config`) or asked for at load."""

    method: str = "fp8"  # e4m3 weights with one fp32 scale per weight block
    weight_block_size: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
    activation_scheme: str = "dynamic"  # activations quantised per token and 128 columns at run time
    from_checkpoint: bool = True  # weights arrive quantised (False: quantise a bf16 checkpoint at load)


def _positive(hf: Mapping[str, Any], key: str, name: str, default: int | None = None) -> int:
    value = hf.get(key, default)
    if value is None or int(value) <= 0:
        raise ValueError(f"model config {name!r}: {key} must be a positive integer, got {value!r}")
    return int(value)


def parse_mla(hf: Mapping[str, Any], name: str) -> MLAConfig:
    """The MLA shape of a DeepSeek-style config; ValueError naming the field the kernels cannot run."""
    q_lora = hf.get("q_lora_rank")
    mla = MLAConfig(
        q_lora_rank=None if q_lora in (None, 0) else _positive(hf, "q_lora_rank", name),
        kv_lora_rank=_positive(hf, "kv_lora_rank", name),
        qk_nope_head_dim=_positive(hf, "qk_nope_head_dim", name),
        qk_rope_head_dim=_positive(hf, "qk_rope_head_dim", name),
        v_head_dim=_positive(hf, "v_head_dim", name),
        rope_interleave=bool(hf.get("rope_interleave", True)),
    )
    if mla.kv_lora_rank != MLA_LATENT_DIM:
        raise ValueError(f"model config {name!r}: kv_lora_rank={mla.kv_lora_rank} is not supported: the MLA "
                         f"kernels and KV cache hold a {MLA_LATENT_DIM}-wide latent")
    if mla.qk_rope_head_dim != MLA_ROPE_DIM:
        raise ValueError(f"model config {name!r}: qk_rope_head_dim={mla.qk_rope_head_dim} is not supported: the "
                         f"MLA kernels and KV cache hold a {MLA_ROPE_DIM}-wide rope key")
    return mla


def deepseek_fields(hf: Mapping[str, Any], name: str) -> dict[str, Any]:
    """ModelConfig keyword arguments of a DeepSeek-V2/V3 / Kimi-K2 config (MLA, routing, MTP)."""
    model_type = hf.get("model_type", "deepseek_v3")
    defaults = _ROUTING_DEFAULTS.get(model_type, _ROUTING_DEFAULTS["deepseek_v3"])
    mla = parse_mla(hf, name)
    topk_method = hf.get("topk_method") or defaults["topk_method"]
    scoring = hf.get("scoring_func") or defaults["scoring_func"]
    if topk_method not in TOPK_METHODS:
        raise ValueError(f"model config {name!r}: topk_method={topk_method!r} is not supported "
                         f"(supported: {', '.join(TOPK_METHODS)})")
    if scoring not in SCORING_FUNCS:
        raise ValueError(f"model config {name!r}: scoring_func={scoring!r} is not supported "
                         f"(supported: {', '.join(SCORING_FUNCS)})")
    if topk_method == "noaux_tc" and scoring != "sigmoid":
        raise ValueError(f"model config {name!r}: topk_method='noaux_tc' needs scoring_func='sigmoid', "
                         f"got {scoring!r}")
    if int(hf.get("moe_layer_freq") or 1) != 1:
        raise ValueError(f"model config {name!r}: moe_layer_freq={hf['moe_layer_freq']} is not supported (1: "
                         f"every layer from first_k_dense_replace on is MoE)")
    num_experts = int(hf.get("n_routed_experts") or 0)
    grouped = topk_method != "greedy"
    n_group = int(hf.get("n_group") or 0) if grouped else 0
    topk_group = int(hf.get("topk_group") or 0) if grouped else 0
    if grouped and num_experts:
        if n_group <= 0 or num_experts % n_group:
            raise ValueError(f"model config {name!r}: n_group={hf.get('n_group')!r} must divide "
                             f"n_routed_experts={num_experts} for topk_method={topk_method!r}")
        if not 0 < topk_group <= n_group:
            raise ValueError(f"model config {name!r}: topk_group={hf.get('topk_group')!r} must be in 1..{n_group}")
    heads = int(hf["num_attention_heads"])
    first_dense = int(hf.get("first_k_dense_replace") or 0)
    return {
        "mla": mla,
        "head_dim": mla.qk_head_dim,
        "num_key_value_heads": heads,  # every head has its own (up-projected) K and V
        "num_experts": num_experts,
        "num_experts_per_tok": int(hf.get("num_experts_per_tok") or 0) if num_experts else 0,
        "norm_topk_prob": bool(hf.get("norm_topk_prob", defaults["norm_topk_prob"])),
        "mlp_only_layers": tuple(range(min(first_dense, int(hf["num_hidden_layers"])))),
        "decoder_sparse_step": 1,
        "scoring_func": scoring,
        "topk_method": topk_method,
        "n_group": n_group,
        "topk_group": topk_group,
        "routed_scaling_factor": float(hf.get("routed_scaling_factor") or 1.0),
        "n_shared_experts": int(hf.get("n_shared_experts") or 0),
        "num_nextn_predict_layers": int(hf.get("num_nextn_predict_layers") or 0),
    }


def parse_quantization(raw: Mapping[str, Any] | None, name: str) -> QuantizationConfig | None:
    """A checkpoint's `quantization_config`; ValueError naming the field when the kernels cannot run it."""
    if not raw:
        return None
    method = raw.get("quant_method")
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"model config {name!r}: quantization_config.quant_method={method!r} is not supported "
                         f"(supported: {', '.join(QUANTIZATION_METHODS)})")
    fmt = raw.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"model config {name!r}: quantization_config.fmt={fmt!r} is not supported (e4m3)")
    block = raw.get("weight_block_size")
    if block is None or [int(b) for b in block] != [FP8_BLOCK, FP8_BLOCK]:
        raise ValueError(f"model config {name!r}: quantization_config.weight_block_size={block!r} is not "
                         f"supported: the FP8 kernels use [{FP8_BLOCK}, {FP8_BLOCK}] blocks (per-tensor FP8 "
                         f"checkpoints are not supported either)")
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ValueError(f"model config {name!r}: quantization_config.activation_scheme={scheme!r} is not "
                         f"supported (dynamic)")
    return QuantizationConfig(weight_block_size=(FP8_BLOCK, FP8_BLOCK))
