"""The engine over 2 torch.distributed ranks (gloo on CPU): rank 0 schedules and samples, the other
rank follows the broadcast step packets. Greedy tokens equal the one-rank engine's, token for token,
and the logprobs of the top candidates agree within 1e-5 (fp32), with overlap scheduling, chunked
prefill, prefix-cache hits and the host KV tier's copies in play; for tensor parallelism with
uneven heads (SmolLM2's 9 / 3), expert parallelism with token shards exchanged by all-to-all
(sequence parallelism) and DeepSeek-V3 (MLA + MoE, experts whole per rank). Every layout of
every model is checked at the model level by test_parallel_tp.py; replicated-token expert
parallelism runs end to end in test_distributed_nodes.py and test_distributed_failures.py."""

from __future__ import annotations

import pytest
from conftest_models import hf_reference_model
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec

SPEC = SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=4)
SYSTEM = [(7 * i) % 250 + 3 for i in range(40)]  # shared by both turns: a prefix-cache hit

CASES = {
    "smollm2-heads-tp2": ("tiny-llama", {"hidden_size": 144, "num_attention_heads": 9, "num_key_value_heads": 3},
                          {"tensor_parallel_size": 2}),
    "qwen3-moe-ep2-sp": ("tiny-qwen3-moe", {}, {"tensor_parallel_size": 2, "enable_expert_parallel": True,
                                               "enable_sequence_parallel": True}),
    "deepseek-moe-tp2-ep2": ("tiny-deepseek-v3", {}, {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
}


def _conversation(engine) -> tuple[dict, dict]:
    tokens, logprobs, history = {}, {}, {}
    for turn in range(2):
        for user in range(2):
            prompt = history.get(user, SYSTEM + [100 + user] * 3)
            submit(engine, f"u{user}t{turn}", prompt, SPEC)
        run = run_until_idle(engine)
        for user in range(2):
            name = f"u{user}t{turn}"
            history[user] = history.get(user, SYSTEM + [100 + user] * 3) + run.tokens[name] + [200 + turn] * 5
        tokens.update(run.tokens)
        logprobs.update(run.logprobs)
    return tokens, logprobs


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for preset, overrides, _ in CASES.values():
        key = (preset, tuple(sorted(overrides.items())))
        if key not in dirs:
            folder = tmp_path_factory.mktemp(preset)
            hf_reference_model(preset, seed=5, **overrides).save_pretrained(folder)
            dirs[key] = str(folder)
    return dirs


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_engine_matches_one_rank(case, model_dirs):
    preset, overrides, parallel = CASES[case]
    model = model_dirs[(preset, tuple(sorted(overrides.items())))]
    settings = dict(load_format="auto", chunked_prefill_size=16, max_num_batched_tokens=32,
                    host_cache_memory="4MiB", num_threads=1)
    one = make_engine(model, **settings)
    one.runner.expert_load.interval_s = 0  # refresh the expert-load counters at every read
    one_tokens, one_logprobs = _conversation(one)
    engine = make_engine(model, **settings, **parallel)
    try:
        assert engine.runner.rank_pids, "a second rank runs"
        engine.runner.expert_load.interval_s = 0
        tokens, logprobs = _conversation(engine)
        assert engine.scheduler.stats()["prefix_hit_tokens"] > 0
        load = engine.stats().expert_load
    finally:
        engine.drain_copies()
        engine.shutdown()
    assert tokens == one_tokens
    # the same tokens reached the same experts (token shards: counted on each rank, reduced to rank 0)
    assert load == one.stats().expert_load and (load is None) == ("moe" not in case)
    if load is not None:
        assert sum(load) > 0
    for name, per_token in one_logprobs.items():
        for ours, ref in zip(logprobs[name], per_token, strict=True):
            assert ours.top_ids == ref.top_ids
            scale = max(1.0, max(abs(v) for v in ref.top_logprobs))
            assert max(abs(a - b) for a, b in zip(ours.top_logprobs, ref.top_logprobs, strict=True)) <= 1e-5 * scale


@pytest.mark.slow
def test_smollm2_at_tp2_matches_one_rank(default_model_path):
    """The default model itself (9 query / 3 KV heads split 6 + 3 / 2 + 1), real weights."""
    # quantization="none": several ranks load weights unquantised (weight-only layers are one-rank only)
    settings = dict(load_format="auto", quantization="none", kv_cache_memory="32MiB", host_cache_memory="4MiB",
                    num_threads=1)
    one_tokens, one_logprobs = _conversation(make_engine(default_model_path, **settings))
    engine = make_engine(default_model_path, tensor_parallel_size=2, **settings)
    try:
        tokens, logprobs = _conversation(engine)
    finally:
        engine.shutdown()
    assert tokens == one_tokens
    for name, per_token in one_logprobs.items():
        for ours, ref in zip(logprobs[name], per_token, strict=True):
            assert max(abs(a - b) for a, b in zip(ours.top_logprobs, ref.top_logprobs, strict=True)) <= 1e-4
