"""GGUF loading: a small file written with gguf.GGUFWriter (Q8_0, Q4_0, Q4_1, F16, F32 tensors,
llama.cpp's Q/K row permutation, tied or separate LM head) dequantises to the right weights and
gives the same logits as transformers reading the same file; bad files are clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest_models import (
    PagedKV,
    Row,
    assert_close_rel,
    hf_logits,
    hf_reference_model,
    single_thread,  # noqa: F401  (fixture used by pytestmark)
)
from lightspeed.loader import load_hf_config, load_model, resolve_model_files

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

# GGUF tensor (per layer after "blk.N.") -> (HF name, quantisation, max error relative to max |w|)
LAYER_TENSORS = {
    "attn_norm.weight": ("input_layernorm.weight", Q.F32, 0.0),
    "ffn_norm.weight": ("post_attention_layernorm.weight", Q.F32, 0.0),
    "attn_q.weight": ("self_attn.q_proj.weight", Q.Q4_0, 0.15),
    "attn_k.weight": ("self_attn.k_proj.weight", Q.Q4_1, 0.1),
    "attn_v.weight": ("self_attn.v_proj.weight", Q.F16, 1e-3),
    "attn_output.weight": ("self_attn.o_proj.weight", Q.Q8_0, 0.01),
    "ffn_gate.weight": ("mlp.gate_proj.weight", Q.Q4_0, 0.15),
    "ffn_up.weight": ("mlp.up_proj.weight", Q.Q8_0, 0.01),
    "ffn_down.weight": ("mlp.down_proj.weight", Q.Q4_1, 0.1),
}

pytestmark = pytest.mark.usefixtures("single_thread")
# Qwen2 q/k/v biases, Qwen3 per-head q/k norms.
QWEN_TENSORS = {
    "attn_q.bias": ("self_attn.q_proj.bias", Q.F32, 0.0),
    "attn_k.bias": ("self_attn.k_proj.bias", Q.F32, 0.0),
    "attn_v.bias": ("self_attn.v_proj.bias", Q.F32, 0.0),
    "attn_q_norm.weight": ("self_attn.q_norm.weight", Q.F32, 0.0),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", Q.F32, 0.0),
}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's row permutation of q/k (HF half-split → interleaved pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(path, hf_model, tie: bool, float32: bool = False, rope_freqs: np.ndarray | None = None,
                     arch: str = "llama") -> dict[str, tuple[np.ndarray, float]]:
    """Write `hf_model` as a GGUF the way llama.cpp converts it (q/k rows permuted for llama only;
    all F32 with `float32`); returns HF name -> (original weight, tolerance)."""
    cfg = hf_model.config
    state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    expected = {}

    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))

    def add(gguf_name: str, hf_name: str, qtype, tol: float, permute_heads: int | None = None):
        if float32:
            qtype, tol = Q.F32, 0.0
        w = state[hf_name].astype(np.float32)
        stored = _permute(w, permute_heads) if permute_heads else w
        if qtype == Q.F32:
            writer.add_tensor(gguf_name, stored)
        elif qtype == Q.F16:
            writer.add_tensor(gguf_name, stored.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(stored, qtype), raw_dtype=qtype)
        expected[hf_name] = (w, tol)

    add("token_embd.weight", "model.embed_tokens.weight", Q.Q8_0, 0.01)
    add("output_norm.weight", "model.norm.weight", Q.F32, 0.0)
    if not tie:
        add("output.weight", "lm_head.weight", Q.F16, 1e-3)
    for i in range(cfg.num_hidden_layers):
        for suffix, (hf_suffix, qtype, tol) in {**LAYER_TENSORS, **QWEN_TENSORS}.items():
            if f"model.layers.{i}.{hf_suffix}" not in state:
                continue
            heads = {"attn_q.weight": cfg.num_attention_heads, "attn_k.weight": cfg.num_key_value_heads}.get(suffix)
            add(f"blk.{i}.{suffix}", f"model.layers.{i}.{hf_suffix}", qtype, tol, heads if arch == "llama" else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "lm_head"])
def gguf_model(request, tmp_path_factory):
    tie = request.param
    hf = hf_reference_model("tiny-llama", seed=5, rope_scaling=None, tie_word_embeddings=tie)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    expected = write_llama_gguf(path, hf, tie)
    return path, expected, tie


def test_dequantised_weights_match_originals(gguf_model):
    path, expected, tie = gguf_model
    model, config = load_model(path, progress=False)
    assert config.torch_dtype == torch.float32 and config.tie_word_embeddings == tie
    assert config.num_key_value_heads == 2 and config.eos_token_ids == (2,)
    params = dict(model.named_parameters())
    for name, (original, tol) in expected.items():
        got = (params.get(name) if "qkv" not in name else None)
        if got is None:  # fused parameters: compare through the model's modules
            got = _fused_slice(model, name)
        err = (got.detach() - torch.from_numpy(original)).abs().max().item()
        assert err <= tol * np.abs(original).max() + 1e-7, f"{name}: error {err}"
    if tie:
        assert model.lm_head.weight is model.model.embed_tokens.weight


def _fused_slice(model, hf_name: str) -> torch.Tensor:
    layer_idx = int(hf_name.split(".")[2])
    layer = model.model.layers[layer_idx]
    attn, mlp = layer.self_attn, layer.mlp
    q, kv = attn.qkv_proj.q_size, attn.qkv_proj.kv_size
    w = attn.qkv_proj.weight
    i = mlp.gate_up_proj.weight.shape[0] // 2
    return {
        "q_proj": w[:q], "k_proj": w[q:q + kv], "v_proj": w[q + kv:],
        "gate_proj": mlp.gate_up_proj.weight[:i], "up_proj": mlp.gate_up_proj.weight[i:],
    }[hf_name.split(".")[-2]]


def test_logits_match_transformers_on_the_same_file(gguf_model):
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path, _, _ = gguf_model
    hf_config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    state = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=hf)["tensors"]
    hf.load_state_dict(state, strict=False)
    ours, config = load_model(path, progress=False)
    tokens = list(range(3, 30))
    (logits,) = PagedKV(config).step(ours, [Row("x", tokens)])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([tokens]), use_cache=False).logits[0]
    assert_close_rel(logits, ref, what="tiny GGUF vs transformers")


def test_resolution_and_config(gguf_model):
    path, _, _ = gguf_model
    assert resolve_model_files(path.parent).load_format == "gguf"  # a directory holding one .gguf
    assert resolve_model_files(path).gguf_file == path
    assert load_hf_config(path).architecture == "LlamaForCausalLM"


def test_bad_gguf_files_are_clear_errors(gguf_model, tmp_path):
    path, _, _ = gguf_model
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated.gguf"):
        load_model(truncated, progress=False)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="garbage.gguf"):
        load_model(garbage, progress=False)


def test_llama3_rope_freqs_recovered(tmp_path):
    """Llama 3.x GGUFs carry rope scaling as a `rope_freqs` tensor (llama.cpp's per-frequency factors)."""
    from lightspeed.loader.gguf_weights import _llama3_factors

    hf = hf_reference_model("tiny-llama", seed=6)  # llama3 scaling, original context 64
    scaling = dict(hf.config.rope_parameters)
    path = tmp_path / "llama3.gguf"
    write_llama_gguf(path, hf, tie=True, float32=True,
                     rope_freqs=_llama3_factors(scaling, scaling["rope_theta"], hf.config.head_dim))
    ours, config = load_model(path, progress=False)
    assert config.rope_scaling["original_max_position_embeddings"] == 64 and config.rope_scaling["factor"] == 8.0
    tokens = list(range(5, 45))
    (logits,) = PagedKV(config).step(ours, [Row("x", tokens)])
    assert_close_rel(logits, hf_logits(hf, tokens), what="llama3 GGUF vs HF")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_gguf_unpermuted_with_biases_and_qk_norm(arch, tmp_path):
    hf = hf_reference_model(f"tiny-{arch}", seed=8)
    path = tmp_path / f"{arch}.gguf"
    write_llama_gguf(path, hf, tie=False, float32=True, arch=arch)
    ours, config = load_model(path, progress=False)
    assert config.architecture == type(hf).__name__
    tokens = list(range(7, 37))
    (logits,) = PagedKV(config).step(ours, [Row("x", tokens)])
    assert_close_rel(logits, hf_logits(hf, tokens), what=f"{arch} GGUF vs HF")
