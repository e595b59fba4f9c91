"""Tensor / expert / data parallelism on GPUs over NCCL (`pytest -m gpu`; skipped with fewer than 2
GPUs): the same checks as the gloo tests (greedy tokens of one rank, fp32 so that only the order
of sums differs), plus CUDA graphs captured with their NCCL collectives and replayed, overlap
scheduling and the CUDA page copier under tensor parallelism."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest_models import hf_reference_model
from engine_driver import make_engine, run_until_idle, submit
from lightspeed import AsyncLLM, EngineConfig, SamplingParams, data_parallel_configs
from lightspeed.core.messages import SamplingSpec
from lightspeed.frontend.tokenizer import byte_level_tokenizer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

SPEC = SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True)
SYSTEM = [(11 * i) % 250 + 3 for i in range(70)]
SETTINGS = dict(load_format="auto", device="cuda", dtype="float32", kv_cache_memory="64MiB",
                host_cache_memory="16MiB", max_num_seqs=8, max_model_len=256, chunked_prefill_size=32,
                max_num_batched_tokens=64)


def _conversation(engine) -> dict[str, list[int]]:
    tokens = {}
    for turn in range(2):
        for user in range(3):
            submit(engine, f"u{user}t{turn}", SYSTEM + [100 + user] * (3 + turn * 20), SPEC)
        tokens.update(run_until_idle(engine).tokens)
    return tokens


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for preset, overrides in (("tiny-llama", {"hidden_size": 144, "num_attention_heads": 9,
                                              "num_key_value_heads": 3}), ("tiny-qwen3-moe", {}),
                              ("tiny-deepseek-v3", {})):
        folder = tmp_path_factory.mktemp(preset)
        hf_reference_model(preset, seed=5, **overrides).save_pretrained(folder)
        dirs[preset] = str(folder)
    return dirs


@pytest.mark.parametrize("preset, parallel", [
    ("tiny-llama", {"tensor_parallel_size": 2}),
    ("tiny-qwen3-moe", {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
    ("tiny-qwen3-moe", {"tensor_parallel_size": 2, "enable_expert_parallel": True, "enable_sequence_parallel": True}),
    ("tiny-deepseek-v3", {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
], ids=["llama-9-3-heads-tp2", "qwen3-moe-ep2", "qwen3-moe-ep2-sp", "deepseek-ep2"])
def test_nccl_engine_matches_one_gpu_with_cuda_graphs(model_dirs, preset, parallel):
    want = _conversation(make_engine(model_dirs[preset], **SETTINGS))
    engine = make_engine(model_dirs[preset], **SETTINGS, **parallel)
    try:
        assert engine.runner.graphs is not None, "CUDA graphs captured on every rank"
        assert _conversation(engine) == want
        assert engine.runner.graphs.num_replays > 0
    finally:
        engine.drain_copies()
        engine.shutdown()


def test_nccl_data_parallel_expert_parallel_cores(model_dirs):
    """DP 2 x TP 1 with EP 2: the two cores step together over one NCCL world (eagerly)."""
    byte_level_tokenizer(256).save_pretrained(model_dirs["tiny-qwen3-moe"])
    base = EngineConfig(model=model_dirs["tiny-qwen3-moe"], **SETTINGS)
    prompts = {"a": SYSTEM[:40], "b": SYSTEM[5:30]}
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    async def serve(cores):
        async def one(core, name):
            outs = [o async for o in core.generate({"prompt_token_ids": prompts[name]}, params, request_id=name)]
            return list(outs[-1].outputs[0].token_ids)
        return await asyncio.gather(one(cores[0], "a"), one(cores[-1], "b"))

    engine = make_engine(model_dirs["tiny-qwen3-moe"], **SETTINGS)
    for name, prompt in prompts.items():
        submit(engine, name, prompt, SamplingSpec(max_tokens=12, temperature=0.0, ignore_eos=True))
    one_gpu = run_until_idle(engine).tokens
    configs = data_parallel_configs(base.replace(data_parallel_size=2, enable_expert_parallel=True))
    cores = AsyncLLM.start_many(configs)
    try:
        assert asyncio.run(serve(cores)) == [one_gpu["a"], one_gpu["b"]]
    finally:
        for core in cores:
            core.shutdown()
