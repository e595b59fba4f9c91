"""GGUF (llama.cpp) files: metadata → HF-style config, tensors → HF-named weights: dequantised to
float32, or kept in their blocks as `QuantizedWeight`s for the weights asked for quantised
(gguf_quants.py maps each block type to the w4 / w8 format that holds it exactly).

llama.cpp's converter permutes the rows of Llama's q/k projections (it pairs rotary features
(i, i+D/2) as adjacent rows); we undo that so the weights match the HF (neox-style) layout.
Qwen2/Qwen3 are converted without the permutation.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightspeed_kernel import QuantizedWeight
from tqdm.auto import tqdm

from ..layers.weight_only import SourceFormat
from .gguf_quants import decode_blocks, native_format

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def open_gguf(path: Path):
    """A `gguf.GGUFReader` over `path`; ValueError naming the file when it is not valid GGUF."""
    from gguf import GGUFReader

    class _PlainArrayReader(GGUFReader):
        # np.memmap slicing runs Python hooks per slice; the reader slices ~10^5 times for the
        # tokenizer strings. A plain ndarray view of the same mapping parses ~3x faster.
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    try:
        return _PlainArrayReader(str(path))
    except Exception as e:  # the reader raises ValueError/IndexError/struct errors on bad bytes
        raise ValueError(f"{path}: not a valid (or a truncated) GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def gguf_hf_config(reader, path: Path) -> dict[str, Any]:
    """An HF `config.json`-style dict from the GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(sorted(_ARCHITECTURES))})")
    if _field(reader, f"{arch}.expert_count", 0):
        raise ValueError(f"{path}: mixture-of-experts GGUF files are not supported")

    def meta(key: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{key}", default)

    hidden, heads = int(meta("embedding_length")), int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    rot_dim = int(meta("rope.dimension_count", head_dim))
    if rot_dim != head_dim:
        raise ValueError(f"{path}: partial rotary ({rot_dim} of {head_dim} features) is not supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    vocab = int(meta("vocab_size", len(tokens) if tokens is not None else 0))
    tensor_names = {t.name for t in reader.tensors}
    config = {
        "architectures": [_ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "max_position_embeddings": int(meta("context_length", 4096)),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(reader, arch, path),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        # Weights are dequantised to float32; pass dtype= to load_model for another.
        "torch_dtype": "float32",
    }
    if "rope_freqs.weight" in tensor_names:
        rope_freqs = next(t for t in reader.tensors if t.name == "rope_freqs.weight")
        factors = dequantize_tensor(rope_freqs, path).reshape(-1)
        config["rope_scaling"] = _llama3_scaling_from_factors(factors, config["rope_theta"], head_dim, path)
    return config


def _llama3_factors(scaling: dict[str, Any], base: float, head_dim: int) -> np.ndarray:
    """llama.cpp's `rope_freqs` for a HF llama3 rope_scaling (convert_hf_to_gguf's formula)."""
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / freqs
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    original, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    smooth = (original / wavelen - low) / (high - low)
    mid = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, mid))


def _llama3_scaling_from_factors(factors: np.ndarray, base: float, head_dim: int, path: Path) -> dict[str, Any]:
    """Llama 3.x GGUFs store rope scaling as per-frequency factors; recover the HF llama3 dict.

    The factor is the largest entry; low/high frequency factors 1 and 4 are Llama 3's; the
    original context length is the power of two that reproduces the stored factors.
    """
    factor = float(factors.max())
    for log2_len in range(6, 21):
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 2**log2_len}
        expected = _llama3_factors(scaling, base, head_dim)
        if expected.shape == factors.shape and np.allclose(expected, factors, rtol=1e-4):
            return scaling
    raise ValueError(f"{path}: rope_freqs.weight does not match Llama 3 rope scaling; not supported")


def _rope_scaling(reader, arch: str, path: Path) -> dict[str, Any] | None:
    kind = _field(reader, f"{arch}.rope.scaling.type", "none")
    factor = _field(reader, f"{arch}.rope.scaling.factor")
    if kind in ("none", None) or not factor:
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        original = _field(reader, f"{arch}.rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(original)}
    raise ValueError(f"{path}: rope scaling {kind!r} is not supported")


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: [H·D, ...] rows (interleaved pairs) → HF half-split order."""
    shape = weight.shape
    return weight.reshape(num_heads, shape[0] // num_heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _unpermute_index(rows: int, num_heads: int) -> torch.Tensor:
    """The row order `_unpermute` produces, as an index (for weights kept quantised)."""
    return torch.from_numpy(_unpermute(np.arange(rows), num_heads).copy())


def dequantize_tensor(tensor, path: Path) -> np.ndarray:
    """float32 array in HF layout ([out, in] for matrices) from one GGUF tensor."""
    from gguf import GGMLQuantizationType, quants

    try:
        values = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        name = GGMLQuantizationType(tensor.tensor_type).name
        raise ValueError(f"{path}: tensor {tensor.name!r} uses quantisation {name}, which cannot be dequantised") from None
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims fastest-first
    return np.asarray(values, dtype=np.float32).reshape(shape)


def gguf_tensor_formats(reader, path: Path) -> dict[str, SourceFormat]:
    """HF name -> the (bits, group) format holding each tensor's blocks exactly (None: float or a
    block type without an exact mapping, which loads dequantised)."""
    from gguf import GGMLQuantizationType

    formats = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, path)
        if name is not None:
            formats[name] = native_format(GGMLQuantizationType(tensor.tensor_type).name)
    return formats


def iterate_gguf_weights(reader, config, path: Path, progress: bool = True,
                         quantized: Collection[str] = ()) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
    """Yield `(hf_name, weight)` for every tensor of the file (`config`: its ModelConfig): a float32
    tensor, or for names in `quantized` whose block type maps exactly, a QuantizedWeight."""
    from gguf import GGMLQuantizationType

    permute = config.model_type == "llama"
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    for tensor in tqdm(reader.tensors, desc="Loading GGUF", unit="tensor", disable=not progress, leave=False):
        name = _hf_name(tensor.name, path)
        if name is None:
            continue
        type_name = GGMLQuantizationType(tensor.tensor_type).name
        if name in quantized and native_format(type_name) is not None:
            rows, cols = (int(d) for d in reversed(tensor.shape))
            weight = decode_blocks(type_name, tensor.data, rows, cols)
            if permute and name.endswith(("q_proj.weight", "k_proj.weight")):
                weight = weight.index_rows(_unpermute_index(rows, heads if "q_proj" in name else kv_heads))
            yield name, weight
            continue
        values = dequantize_tensor(tensor, path)
        if permute and name.endswith("q_proj.weight"):
            values = _unpermute(values, heads)
        elif permute and name.endswith("k_proj.weight"):
            values = _unpermute(values, kv_heads)
        if not values.flags.writeable or not values.flags.c_contiguous:  # F32 tensors view the mapping
            values = np.array(values, dtype=np.float32, order="C")
        yield name, torch.from_numpy(values)


def _hf_name(gguf_name: str, path: Path) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER.match(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    if gguf_name == "rope_freqs.weight":
        return None
    raise ValueError(f"{path}: unexpected GGUF tensor {gguf_name!r}")
