"""Data-parallel attention with expert parallelism across the cores (TP 2 x DP 2, EP 4 over one gloo
world of 4 ranks): two engine cores, each with its own scheduler and requests, step together through
one expert-parallel MoE (an idle core runs a dummy forward), and produce the greedy tokens of one
core on one rank."""

from __future__ import annotations

import asyncio

import pytest
from conftest_models import hf_reference_model
from engine_driver import make_engine, run_until_idle, submit
from lightspeed import AsyncLLM, EngineConfig, SamplingParams, data_parallel_configs
from lightspeed.core.messages import SamplingSpec
from lightspeed.frontend.tokenizer import byte_level_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
SETTINGS = dict(kv_cache_memory="8MiB", host_cache_memory="1MiB", max_num_seqs=4, max_model_len=128, num_threads=1)
PROMPTS = {"a": list(range(3, 30)), "b": list(range(40, 52)), "c": [9, 8, 7, 6, 5, 4, 3]}


async def _generate(core: AsyncLLM, name: str) -> list[int]:
    outputs = [out async for out in core.generate({"prompt_token_ids": PROMPTS[name]}, GREEDY, request_id=name)]
    return list(outputs[-1].outputs[0].token_ids)


async def _serve(cores: list[AsyncLLM]) -> dict[str, list[int]]:
    first, second = cores[0], cores[-1]
    a, b = await asyncio.gather(_generate(first, "a"), _generate(second, "b"))
    return {"a": a, "b": b, "c": await _generate(first, "c")}  # the other core idles (dummy steps)


def test_data_parallel_expert_parallel_cores_match_one_core(tmp_path):
    hf_reference_model("tiny-qwen3-moe", seed=5).save_pretrained(tmp_path)
    byte_level_tokenizer(256).save_pretrained(tmp_path)  # the model's 256 ids
    base = EngineConfig(model=str(tmp_path), **SETTINGS)
    with pytest.raises(ValueError, match="data_parallel_size > 1"):
        AsyncLLM(config=base.replace(data_parallel_size=2))
    one = make_engine(str(tmp_path), load_format="auto", **SETTINGS)  # in process: one core, one rank
    for name, prompt in PROMPTS.items():
        submit(one, name, prompt, SamplingSpec(max_tokens=GREEDY.max_tokens, temperature=0.0, ignore_eos=True))
    want = run_until_idle(one).tokens
    configs = data_parallel_configs(base.replace(tensor_parallel_size=2, data_parallel_size=2,
                                                 enable_expert_parallel=True))
    assert [c.data_parallel_rank for c in configs] == [0, 1] and configs[0].master_port == configs[1].master_port
    cores = AsyncLLM.start_many(configs)  # the cores rendezvous with each other while they load
    try:
        assert all(len(core.engine_info.rank_pids) == 1 for core in cores)
        assert asyncio.run(_serve(cores)) == want
    finally:
        for core in cores:
            core.shutdown()


def test_data_parallel_cores_get_their_own_disk_directories(tiny_model_dir, tmp_path):
    base = EngineConfig(model=tiny_model_dir, load_format="dummy", data_parallel_size=2,
                        disk_cache_dir=str(tmp_path), disk_cache_size=64 << 20, **SETTINGS)
    configs = data_parallel_configs(base)  # the tier locks its files: one directory per core
    assert [c.disk_cache_dir for c in configs] == [str(tmp_path / "dp0"), str(tmp_path / "dp1")]
    assert [c.disk_cache_size for c in configs] == [32 << 20, 32 << 20]


def test_disk_tier_with_cores_that_step_together_is_refused(tmp_path):
    hf_reference_model("tiny-qwen3-moe", seed=5).save_pretrained(tmp_path)
    base = EngineConfig(model=str(tmp_path), load_format="dummy", data_parallel_size=2,
                        enable_expert_parallel=True, disk_cache_dir=str(tmp_path / "kv"), **SETTINGS)
    with pytest.raises(ValueError, match="step together"):
        data_parallel_configs(base)
