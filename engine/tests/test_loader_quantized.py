"""Weight-only quantised loading (--quantization): GGUF blocks decoded exactly (gguf-py's
dequantisation is the ground truth), the transform keeps ties and loaders, and quantised models
give the logits of their dequantised weights (GGUF, HF float, dummy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest_models import (
    PagedKV,
    Row,
    assert_close_rel,
    hf_reference_model,
    single_thread,  # noqa: F401  (fixture used by pytestmark)
)
from lightspeed.layers.weight_only import (
    choose_format,
    named_weights,
    plan_formats,
    quantization_report,
    quantize_weights,
)
from lightspeed.loader import load_model
from lightspeed.loader.gguf_quants import FORMATS, decode_blocks
from lightspeed_kernel import QuantizedWeight
from test_loader_gguf import write_llama_gguf

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("single_thread")

# byte offsets of the fp16 scale fields of each block type (random bytes there could be inf/nan)
_F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,)}


def _random_blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    _, _, block, nbytes, _ = FORMATS[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for offset in _F16_FIELDS[type_name]:
        scales = (rng.random(raw.shape[0]) * 0.02 + 1e-3).astype(np.float16)
        raw[:, offset:offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("type_name", sorted(FORMATS))
def test_gguf_blocks_decode_to_what_gguf_dequantises(type_name):
    rows, cols = 3, 512
    raw = _random_blocks(type_name, rows, cols, seed=len(type_name))
    qtype = gguf.GGMLQuantizationType[type_name]
    expected = torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float32))
    weight = decode_blocks(type_name, raw, rows, cols)
    bits, group = FORMATS[type_name][:2]
    assert weight.format == f"w{bits}/g{group}" and weight.shape == (rows, cols)
    torch.testing.assert_close(weight.dequantize(), expected, rtol=1e-6, atol=1e-7)


def test_choose_format():
    q4, q6, q8 = (4, 32), (8, 16), (8, 32)
    assert choose_format("gguf", [q4, q4, q6]) == (8, 16)  # a fused QKV with a Q6_K v: widened exactly
    assert choose_format("gguf", [q4, None]) is None  # a float shard: the layer stays float
    assert choose_format("int4", [q8]) == (4, 32)  # requantised
    assert choose_format("int4", [(4, 16)]) == (4, 16)  # Q2_K / Q3_K groups kept
    assert choose_format("int8", [q4, q6]) == (8, 16)
    assert choose_format("int8", [None]) == (8, 32)
    assert choose_format("none", [q4]) is None
    with pytest.raises(ValueError, match="scheme"):
        choose_format("int3", [q4])


def test_transform_keeps_ties_and_loaders():
    from lightspeed.models import build_model, preset_config

    model = build_model(preset_config("tiny-llama"))
    plan = plan_formats(model, "int4", {})
    assert "model.embed_tokens.weight" in plan and "lm_head.weight" not in plan  # tied: listed once
    replaced = quantize_weights(model, plan)
    assert model.lm_head.weight is model.model.embed_tokens.weight is replaced["model.embed_tokens.weight"]
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.weight, QuantizedWeight) and qkv.weight.weight_loader == qkv.weight_loader
    assert set(named_weights(model)) >= set(plan)
    with pytest.raises(ValueError, match="not a linear"):
        quantize_weights(model, {"model.norm.weight": (4, 32)})


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    # Q8_0 embedding, Q4_0 / Q4_1 / Q8_0 / F16 layer tensors (test_loader_gguf.LAYER_TENSORS), untied
    hf = hf_reference_model("tiny-llama", seed=5, rope_scaling=None, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("gguf_q") / "tiny.gguf"
    write_llama_gguf(path, hf, tie=False)
    return path


def _logits(model, config, tokens):
    kv = PagedKV(config)
    (prefill,) = kv.step(model, [Row("a", tokens)])
    (decode,) = kv.step(model, [Row("a", [7], decode=True)])
    return torch.cat([prefill, decode])


@torch.no_grad()
def _with_weights_of(dense, quantized):
    """`dense` with every weight that `quantized` holds quantised replaced by its dequantisation."""
    params = named_weights(dense)
    for name, weight in named_weights(quantized).items():
        if isinstance(weight, QuantizedWeight):
            params[name].copy_(weight.dequantize())
    return dense


def _check_paths(ours, dense, config, tokens, rel, scheme):
    """The quantised kernels compute what their weights say (tight), and those weights are close
    to the checkpoint's (`rel`: what the scheme's rounding allows on these random weights)."""
    original = _logits(dense, config, tokens)
    got = _logits(ours, config, tokens)
    assert_close_rel(got, original, rel=rel, what=f"{scheme} vs the checkpoint's weights")
    assert_close_rel(got, _logits(_with_weights_of(dense, ours), config, tokens), rel=2e-5,
                     what=f"{scheme} kernels vs their own dequantised weights")


@pytest.mark.parametrize("scheme,rel", [("gguf", 2e-5), ("int8", 0.03), ("int4", 0.5)])
def test_quantised_gguf_matches_its_dequantised_weights(tiny_gguf, scheme, rel):
    tokens = list(range(3, 30))
    dense, config = load_model(tiny_gguf, progress=False)
    ours, _ = load_model(tiny_gguf, progress=False, quantization=scheme)
    report = quantization_report(ours)
    if scheme == "gguf":  # F16 tensors (v_proj, lm_head) keep their fused layers float
        assert report.formats["model.embed_tokens.weight"] == "w8/g32" and not report.requantized
        assert report.formats["model.layers.0.mlp.gate_up_proj.weight"] == "w8/g32"  # Q4_0 gate, Q8_0 up
        assert "model.layers.0.self_attn.qkv_proj.weight" not in report.formats
        assert "lm_head.weight" not in report.formats
    elif scheme == "int8":  # only the F16 tensors needed requantising, and barely moved
        assert set(report.formats.values()) == {"w8/g32"}
        assert set(report.requantized) == {"model.layers.0.self_attn.qkv_proj.weight",
                                           "model.layers.1.self_attn.qkv_proj.weight", "lm_head.weight"}
        assert max(report.requantized.values()) < 0.01
    else:
        assert set(report.formats.values()) == {"w4/g32"} and 0 < max(report.requantized.values()) < 0.12
    assert report.quantized_bytes < report.float_bytes / 2
    _check_paths(ours, dense, config, tokens, rel, scheme)


def test_quantised_hf_checkpoint(tmp_path):
    hf = hf_reference_model("tiny-qwen2", seed=3)
    hf.save_pretrained(tmp_path)
    tokens = list(range(5, 25))
    dense, config = load_model(tmp_path, progress=False)
    for scheme, rel in (("int8", 0.03), ("int4", 0.5)):
        ours, _ = load_model(tmp_path, progress=False, quantization=scheme)
        report = quantization_report(ours)
        assert set(report.requantized) == set(report.formats)  # everything quantised from float
        fresh, _ = load_model(tmp_path, progress=False)
        _check_paths(ours, fresh, config, tokens, rel, scheme)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(tmp_path, progress=False, quantization="gguf")


def test_dummy_weights_quantise():
    model, config = load_model("tiny-qwen3", load_format="dummy", progress=False, quantization="int4")
    assert isinstance(model.lm_head.weight, QuantizedWeight)
    (logits,) = PagedKV(config).step(model, [Row("a", [1, 2, 3])])
    assert torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="quantization"):
        load_model("tiny-qwen3", load_format="dummy", progress=False, quantization="int3")


def test_auto_resolves_by_device_and_file(tiny_gguf, tmp_path):
    from lightspeed import EngineConfig
    from lightspeed.runner.factory import default_cpu_threads, resolve_quantization
    from lightspeed_kernel.cpu import NATIVE_AVAILABLE

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert resolve_quantization("auto", cpu, "auto", str(tiny_gguf)) == ("gguf" if NATIVE_AVAILABLE else "none")
    assert resolve_quantization("auto", gpu, "auto", str(tiny_gguf)) == "none"
    assert resolve_quantization("auto", cpu, "dummy", "tiny-llama") == "none"
    hf_reference_model("tiny-llama").save_pretrained(tmp_path)
    assert resolve_quantization("auto", cpu, "auto", str(tmp_path)) == "none"  # float checkpoints stay float
    assert resolve_quantization("int4", cpu, "auto", str(tmp_path)) == "int4"
    with pytest.raises(ValueError, match="CPU kernels only"):
        resolve_quantization("int8", gpu, "auto", str(tiny_gguf))
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="int3")
    import os

    assert 1 <= default_cpu_threads() <= (os.cpu_count() or 1)
