"""--speculative-config as vLLM spells it, and clear start-up errors for bad configurations."""

import dataclasses
import json

import pytest
from engine_driver import make_engine
from lightspeed import EngineConfig, engine_arg_specs
from lightspeed.spec import SpeculativeConfig
from spec_helpers import write_random_eagle3_head


def test_parsed_from_json_dict_or_instance_and_survives_the_core_handoff():
    config = EngineConfig.from_cli(speculative_config='{"method": "ngram", "num_speculative_tokens": 4, '
                                                      '"prompt_lookup_max": 6}')
    assert config.speculative_config == SpeculativeConfig("ngram", 4, prompt_lookup_max=6)
    # The engine core receives the config as JSON (dataclasses.asdict).
    again = EngineConfig(**json.loads(json.dumps(dataclasses.asdict(config))))
    assert again.speculative_config == config.speculative_config
    assert EngineConfig(speculative_config={"method": "suffix", "num_speculative_tokens": 2}).speculative_config.method \
        == "suffix"
    assert EngineConfig(speculative_config=None).speculative_config is None
    spec = next(s for s in engine_arg_specs() if s.name == "speculative_config")
    assert spec.flag == "--speculative-config" and "num_speculative_tokens" in spec.help


@pytest.mark.parametrize("value, message", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "unknown method 'medusa'"),
    ({"method": "ngram", "num_speculative_tokens": 0}, r"num_speculative_tokens must be an integer in 1..15"),
    ({"method": "ngram", "num_speculative_tokens": 16}, r"1..15"),
    ({"method": "ngram"}, "needs 'num_speculative_tokens'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tp": 2}, "unknown key"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "below"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, "needs \"model\""),
    ('{"method": "ngram", ', "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
])
def test_bad_values_raise_value_error_naming_the_problem(value, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=value)


def test_mtp_needs_a_model_with_an_mtp_module(tiny_model_dir):
    with pytest.raises(ValueError, match="has no MTP module"):
        make_engine(tiny_model_dir, speculative_config={"method": "mtp", "num_speculative_tokens": 1})


def test_eagle3_head_for_another_vocabulary_is_refused_at_start_up(tiny_model_dir, tmp_path):
    from lightspeed.models import ModelConfig

    target = ModelConfig.from_pretrained(tiny_model_dir)
    head = write_random_eagle3_head(tmp_path / "head", target, vocab_size=32000, draft_vocab_size=1000)
    with pytest.raises(ValueError, match=r"vocabulary \(32000 tokens\) differs from the target model's \(49152\)"):
        make_engine(tiny_model_dir, speculative_config={"method": "eagle3", "num_speculative_tokens": 2,
                                                        "model": str(head)})
    with pytest.raises(ValueError, match="no config.json"):
        make_engine(tiny_model_dir, speculative_config={"method": "eagle3", "num_speculative_tokens": 2,
                                                        "model": str(tmp_path / "missing")})


def test_eagle3_head_loads_its_checkpoint(tiny_model_dir, tmp_path):
    import torch
    from lightspeed.loader import load_eagle3, load_model

    target, config = load_model(tiny_model_dir, load_format="dummy", progress=False)
    folder = write_random_eagle3_head(tmp_path / "head", config, draft_vocab_size=64, seed=3)
    head = load_eagle3(folder, target)
    from safetensors.torch import load_file

    saved = load_file(str(folder / "model.safetensors"))
    assert torch.equal(head.fc.weight, saved["fc.weight"])
    q_size, kv_size = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    q, k, v = head.midlayer.self_attn.qkv_proj.weight.split([q_size, kv_size, kv_size], dim=0)
    assert torch.equal(q, saved["midlayer.self_attn.q_proj.weight"])
    assert torch.equal(v, saved["midlayer.self_attn.v_proj.weight"])
    assert torch.equal(head.d2t, saved["d2t"])
    assert target.model.aux_hidden_layers == (1, 1, 0)  # vLLM's (2, L/2, L-3), clamped to 2 layers


@pytest.mark.parametrize("parallel", [dict(tensor_parallel_size=2),
                                      dict(data_parallel_size=2, enable_expert_parallel=True)], ids=["tp", "ep"])
def test_several_ranks_per_core_are_refused_and_data_parallel_cores_are_not(parallel):
    ngram = '{"method": "ngram", "num_speculative_tokens": 3}'
    with pytest.raises(ValueError, match="one rank"):
        EngineConfig(model="m", speculative_config=ngram, **parallel)
    assert EngineConfig(model="m", speculative_config=ngram, data_parallel_size=2).speculative_config.method == "ngram"
