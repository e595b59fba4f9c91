"""Logits of every architecture match Hugging Face transformers (fp32, CPU, random weights):
batched prefills of different lengths, chunked prefill over a cached prefix, a prefix-cache hit,
decode steps (one and several query tokens), all through the paged KV cache."""

from __future__ import annotations

import random

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
from lightspeed.loader import load_model

ARCHS = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe"]

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module", params=ARCHS)
def models(request, tmp_path_factory):
    """(ours loaded from a saved HF directory, the HF reference) for one architecture."""
    hf = hf_reference_model(request.param, seed=ARCHS.index(request.param))
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    ours, config = load_model(str(path), dtype=torch.float32, progress=False)
    assert type(ours).__name__ == config.architecture
    return ours, hf, config


def _tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def test_batched_chunked_prefill_then_decode(models):
    ours, hf, config = models
    rng = random.Random(0)
    vocab = config.vocab_size
    seqs = {"a": _tokens(rng, 5, vocab), "b": _tokens(rng, 11, vocab), "c": _tokens(rng, 17, vocab)}
    kv = PagedKV(config, page_size=4)
    got: dict[str, list[torch.Tensor]] = {name: [] for name in seqs}

    def run(rows: list[Row]) -> None:
        for row, logits in zip(rows, kv.step(ours, rows), strict=True):
            got[row.request].append(logits)

    # Step 1: three prefills of different lengths, "b" only its first chunk (6 of 11).
    run([Row("a", seqs["a"]), Row("b", seqs["b"][:6]), Row("c", seqs["c"])])
    # Step 2: decodes of "a" and "c" first, then the rest of "b" over its cached 6-token prefix.
    for name in ("a", "c"):
        seqs[name].append(rng.randrange(vocab))
    run([Row("a", seqs["a"][-1:], True), Row("c", seqs["c"][-1:], True), Row("b", seqs["b"][6:])])
    # Step 3: decode rows only; "b" verifies 3 tokens at once (speculative decoding).
    new = {"a": 1, "b": 3, "c": 1}
    for name, n in new.items():
        seqs[name] += _tokens(rng, n, vocab)
    run([Row(name, seqs[name][-n:], True) for name, n in new.items()])

    for name, tokens in seqs.items():
        assert_close_rel(torch.cat(got[name]), hf_logits(hf, tokens), what=f"{config.architecture} request {name}")


def test_prefix_cache_hit(models):
    ours, hf, config = models
    rng = random.Random(1)
    shared = _tokens(rng, 8, config.vocab_size)
    first, second = shared + _tokens(rng, 3, config.vocab_size), shared + _tokens(rng, 5, config.vocab_size)
    kv = PagedKV(config, page_size=4)
    kv.step(ours, [Row("first", first)])
    kv.share_prefix("first", "second", len(shared))  # two full pages of "first" reused
    (logits,) = kv.step(ours, [Row("second", second[len(shared):])])
    assert_close_rel(logits, hf_logits(hf, second)[len(shared):], what=f"{config.architecture} prefix hit")


def test_compute_logits_contract(models):
    ours, _, config = models
    hidden = torch.randn(3, config.hidden_size)
    logits = ours.compute_logits(hidden)
    assert logits.dtype == torch.float32 and logits.shape == (3, config.vocab_size)


ROPE_VARIANTS = {
    "linear": ("tiny-llama", {"rope_type": "linear", "factor": 2.0}),
    "llama3": ("tiny-llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "yarn": ("tiny-qwen3", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
}


@pytest.mark.parametrize("variant", sorted(ROPE_VARIANTS))
def test_rope_scaling_matches_transformers(variant, tmp_path):
    preset, scaling = ROPE_VARIANTS[variant]
    hf = hf_reference_model(preset, seed=7, rope_scaling=scaling)
    hf.save_pretrained(tmp_path)
    ours, config = load_model(str(tmp_path), dtype=torch.float32, progress=False)
    assert config.rope_scaling["rope_type"] == variant
    rng = random.Random(2)
    tokens = _tokens(rng, 40, config.vocab_size)
    kv = PagedKV(config, page_size=8)
    (prefill,) = kv.step(ours, [Row("r", tokens[:-1])])
    (decode,) = kv.step(ours, [Row("r", tokens[-1:], decode=True)])
    assert_close_rel(torch.cat([prefill, decode]), hf_logits(hf, tokens), what=f"rope {variant}")
