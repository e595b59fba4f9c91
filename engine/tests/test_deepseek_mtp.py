"""DeepSeek-V3's MTP module loads from the checkpoint's layer `num_hidden_layers` and runs as a
next-token predictor over the main model's hidden states through the paged MLA cache, matching
transformers' `MtpLayer` (fp32, CPU) in prefill and in decode steps."""

from __future__ import annotations

import random

import pytest
import torch
from conftest_models import (
    PagedMLA,
    Row,
    assert_close_rel,
    hf_reference_model,
    single_thread,  # noqa: F401  (fixture used by pytestmark)
)
from lightspeed.loader import load_model, load_mtp
from safetensors.torch import save_file

pytestmark = pytest.mark.usefixtures("single_thread")


def _checkpoint_names(hf_mtp_state: dict, layer: int) -> dict[str, torch.Tensor]:
    """transformers' MtpModel names -> DeepSeek-V3 checkpoint names (`model.layers.{layer}.*`)."""
    out = {}
    for name, tensor in hf_mtp_state.items():
        if not name.startswith("layers.0."):
            continue
        rest = name.removeprefix("layers.0.").replace("mtp_block.", "").replace("post_norm.", "shared_head.norm.")
        out[f"model.layers.{layer}.{rest}"] = tensor.contiguous()
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers.modeling_layers import MtpModel

    hf = hf_reference_model("tiny-deepseek-v3", seed=11)
    torch.manual_seed(12)
    mtp_ref = MtpModel(hf, 1).eval()
    with torch.no_grad():
        for name, param in mtp_ref.named_parameters():
            if name.startswith("layers."):
                param.copy_(1.0 + 0.2 * torch.randn_like(param) if "norm" in name else 0.1 * torch.randn_like(param))
        for name, buffer in mtp_ref.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn_like(buffer))
    path = tmp_path_factory.mktemp("mtp")
    hf.save_pretrained(path)
    layer = hf.config.num_hidden_layers
    tensors = _checkpoint_names(mtp_ref.state_dict(), layer)
    # DeepSeek-V3 stores copies of the embedding and head in the MTP layer too.
    tensors[f"model.layers.{layer}.embed_tokens.weight"] = hf.model.embed_tokens.weight.detach().clone()
    tensors[f"model.layers.{layer}.shared_head.head.weight"] = hf.lm_head.weight.detach().clone()
    save_file(tensors, str(path / "mtp.safetensors"))
    main, config = load_model(str(path), dtype=torch.float32, progress=False)  # skips layer 3
    return main, config, load_mtp(str(path), main, progress=False), hf, mtp_ref


@torch.no_grad()
def _hf_mtp_logits(hf, mtp_ref, ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(len(ids))[None]
    out = mtp_ref.forward_layer(0, hidden[None], positions, None, input_ids=torch.tensor([ids]))
    return hf.lm_head(out)[0].float()


def test_mtp_predicts_over_main_hidden_states(setup):
    main, config, mtp, hf, mtp_ref = setup
    assert mtp.layer_idx == config.num_hidden_layers == 3 and mtp.eh_proj.weight.dtype == torch.float32
    rng = random.Random(0)
    tokens = [rng.randrange(config.vocab_size) for _ in range(21)]
    kv = PagedMLA(config, page_size=4, extra_layers=1)  # the MTP block caches into layer 3
    with torch.no_grad():
        ids, positions, meta = kv.metadata([Row("main", tokens[:20])])
        hidden = main(ids, positions, meta)  # [20, H] final (normed) hidden states
        # MTP input i: the main model's hidden at i and the embedding of token i+1 (predicting i+2).
        prefill_ids = tokens[1:17]
        ids, positions, meta = kv.metadata([Row("mtp", prefill_ids)])
        prefill = mtp.compute_logits(mtp(ids, positions, hidden[:16], meta))
        steps = []
        for i in range(16, 20):  # then one token at a time, over the MTP layer's cache
            ids, positions, meta = kv.metadata([Row("mtp", [tokens[i + 1]], decode=True)])
            steps.append(mtp.compute_logits(mtp(ids, positions, hidden[i : i + 1], meta)))
    got = torch.cat([prefill, *steps])
    want = _hf_mtp_logits(hf, mtp_ref, tokens[1:21], hidden)
    assert_close_rel(got, want, what="MTP logits")
    assert got.shape == (20, config.vocab_size)


def test_missing_mtp_module_is_a_clear_error(tmp_path):
    hf = hf_reference_model("tiny-deepseek-v3", seed=13)
    hf.save_pretrained(tmp_path)  # transformers saves no MTP weights
    main, _ = load_model(str(tmp_path), dtype=torch.float32, progress=False)
    with pytest.raises(ValueError, match="no complete MTP module model.layers.3"):
        load_mtp(str(tmp_path), main, progress=False)
    with pytest.raises(ValueError, match="MTP module 1 does not exist"):
        load_mtp(str(tmp_path), main, depth=1, progress=False)
    dummy, _ = load_model("tiny-deepseek-v3", load_format="dummy", progress=False, quantization="fp8")
    draft = load_mtp("tiny-deepseek-v3", dummy, load_format="dummy", progress=False)
    assert draft.eh_proj.weight.dtype == torch.float32  # never quantised
    assert draft.mtp_block.mlp.experts.w13_weight.dtype == torch.float8_e4m3fn
