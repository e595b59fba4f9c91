"""Test helpers for the model tests: a tiny paged KV cache that builds `AttentionMetadata` the way
the runner does (decode rows first), and random-weight Hugging Face reference models."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch
from lightspeed.layers import AttentionMetadata
from lightspeed.models import ModelConfig, preset_hf_config

# A tiny random Llama with SmolLM2's vocabulary (load_format="dummy"). Here, not in conftest.py: pytest imports
# every test folder's conftest as `conftest`, so `from conftest import` breaks when packages' tests run together.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
    "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32",
}


@dataclass
class Row:
    """One request's share of a step: its new tokens; `decode` rows must come first."""

    request: str
    tokens: list[int]
    decode: bool = False


@dataclass
class PagedKV:
    """Per-layer `[num_pages, page_size, Hkv, D]` caches with a shuffled free list (page 0 = padding)."""

    config: ModelConfig
    num_pages: int = 64
    page_size: int = 4
    dtype: torch.dtype = torch.float32
    tp_size: int = 1
    tp_rank: int = 0
    seed: int = 0
    pages: dict[str, list[int]] = field(default_factory=dict)
    lens: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        heads = self.config.num_kv_heads_per_rank(self.tp_size, self.tp_rank)
        shape = (self.num_pages, self.page_size, heads, self.config.head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                          for _ in range(self.config.num_hidden_layers)]
        self.free = list(range(1, self.num_pages))
        random.Random(self.seed).shuffle(self.free)  # non-contiguous pages, like a busy pool

    def share_prefix(self, source: str, request: str, num_tokens: int) -> None:
        """Prefix-cache hit: `request` starts with the first `num_tokens` (whole pages) of `source`."""
        assert num_tokens % self.page_size == 0
        self.pages[request] = list(self.pages[source][: num_tokens // self.page_size])
        self.lens[request] = num_tokens

    def metadata(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        decode_flags = [r.decode for r in rows]
        assert decode_flags == sorted(decode_flags, reverse=True), "decode rows come first"
        ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        for row in rows:
            start = self.lens.get(row.request, 0)
            end = start + len(row.tokens)
            pages = self.pages.setdefault(row.request, [])
            while len(pages) * self.page_size < end:
                pages.append(self.free.pop())
            for pos in range(start, end):
                positions.append(pos)
                slots.append(pages[pos // self.page_size] * self.page_size + pos % self.page_size)
            ids += row.tokens
            starts.append(len(ids))
            seq_lens.append(end)
            self.lens[row.request] = end
        max_pages = max(len(self.pages[r.request]) for r in rows)
        table = [self.pages[r.request] + [0] * (max_pages - len(self.pages[r.request])) for r in rows]
        num_decodes = sum(decode_flags)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            page_table=torch.tensor(table, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            num_decodes=num_decodes,
            num_decode_tokens=starts[num_decodes],
            max_query_len=max(len(r.tokens) for r in rows),
            kv_caches=self.kv_caches,
        )
        return torch.tensor(ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), meta

    @torch.no_grad()
    def step(self, model, rows: list[Row]) -> list[torch.Tensor]:
        """Run one forward; returns each row's float32 logits `[len(tokens), V]`."""
        ids, positions, meta = self.metadata(rows)
        logits = model.compute_logits(model(ids, positions, meta))
        return list(logits.split([len(r.tokens) for r in rows]))


@dataclass
class PagedMLA(PagedKV):
    """`PagedKV` over an MLA pool (one latent row per token and layer); `extra_layers` adds cache
    layers past the model's (the MTP module's). `dtype` is the pool's: fp32, bf16 or float8_e4m3fn."""

    extra_layers: int = 0

    def __post_init__(self) -> None:
        from lightspeed.kv import MLAKVPool, MLALayout

        layout = MLALayout(self.config.num_hidden_layers + self.extra_layers, self.page_size, self.dtype)
        self.pool = MLAKVPool(layout, self.num_pages, "cpu")
        self.kv_caches = self.pool.kv_caches
        self.free = list(range(1, self.num_pages))
        random.Random(self.seed).shuffle(self.free)


def hf_reference_model(preset: str, seed: int = 0, **overrides):
    """A transformers model of a `tiny-*` preset with random weights large enough to matter
    (norm weights and biases perturbed too, so a mis-loaded one shows in the logits; DeepSeek-V3's
    routing correction bias, a buffer, too)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_dict = {**preset_hf_config(preset), **overrides}
    hf_dict.pop("architectures")
    hf_config = AutoConfig.for_model(hf_dict.pop("model_type"), **hf_dict)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    return model


@torch.no_grad()
def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Full forward without a cache: float32 logits `[len(tokens), V]`."""
    return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].float()


def assert_close_rel(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-4, what: str = "") -> None:
    err = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * scale, f"{what}: max |diff| {err:.3e} > {rel} x max |ref| {scale:.3e}"


@pytest.fixture(scope="module", autouse=False)
def single_thread():
    """One intra-op thread for the module: on a 2-core machine shared with other test processes,
    torch's OpenMP threads spin against each other and run ~10x slower than one thread."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
