"""GPU: a DeepSeek-V3-shaped model (real MLA head dims, small width) through the runner on CUDA.

The registry picks the Triton MLA kernels (store, absorbed decode, prefill) and the FP8 block
GEMMs; decode steps replayed from CUDA graphs (MLA plan/run inside the graph) give the eager
step's logits; the registry's kernels agree with the torch references; FP8 weights + FP8 latent
cache run under graphs too. Skipped without a GPU.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.gpu

SMALL_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 4096,
    "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 256, "num_hidden_layers": 3,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 1, "n_routed_experts": 16,
    "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "first_k_dense_replace": 1, "kv_lora_rank": 512,
    "q_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096},
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
}
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def _engine(tmp_path, fp8: bool, **overrides):
    """The engine's runner and scheduler, stepped by hand below (no host tier: no KV copies)."""
    from engine_driver import make_engine

    config = {**SMALL_V3, **({"quantization_config": FP8} if fp8 else {})}
    (tmp_path / "config.json").write_text(json.dumps(config))
    settings = dict(device="cuda", dtype="bfloat16", kv_cache_dtype="fp8" if fp8 else "auto",
                    kv_cache_memory="1GiB", host_cache_memory=0, max_num_seqs=8, max_model_len=2048, page_size=64,
                    cuda_graph_max_batch_size=8, enable_prefix_cache=False, seed=3)
    engine = make_engine(str(tmp_path), **{**settings, **overrides})
    return engine.runner, engine.scheduler


def _submit(runner, sched, prompts, max_tokens=8):
    from lightspeed.core.messages import SamplingSpec
    from lightspeed_scheduler import RequestSpec

    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        rid = sched.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=max_tokens, ignore_eos=True))
        runner.add_request(rid, spec, prompt)


def _steps(runner, sched, forward):
    """Step the scheduler by hand: `forward(plan, t) -> logits` decides what is sampled."""
    n = 0
    while sched.has_unfinished():
        plan = sched.next_plan()
        runner._bind_new_rows(plan)
        if plan.input_ids.shape[0] == 0:
            sched.advance(plan, [])
            continue
        t = runner.inputs.build(plan, runner._prev_sampled)
        with torch.inference_mode():
            logits = forward(plan, t)
            sched.advance(plan, runner.collect(runner._sample(plan, logits, t)).tokens)
        n += 1
    return n


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_registry_picks_the_fast_mla_and_fp8_kernels():
    import lightspeed_kernel as lk
    from lightspeed_mla import sm90

    platform = lk.current_platform()
    # FP8 caches: the sm_90a CUDA kernel on an H100 / H200 where nvcc is found, else Triton.
    on_sm90 = torch.cuda.get_device_capability() == (9, 0) and sm90.availability()[0]
    assert lk.select_kernel("mla", "decode", torch.bfloat16, platform=platform,
                            traits={"page_size": 64, "kv_dtype": "fp8"}, features=("paged", "fp8_kv")).name == \
        (sm90.KERNEL_NAME if on_sm90 else "mla_decode_triton")
    assert lk.select_kernel("mla", "store", torch.bfloat16, platform=platform).name == "mla_store_triton"
    assert lk.select_kernel("mla", "prefill", torch.bfloat16, platform=platform,
                            traits={"head_dim_qk": 192, "head_dim_v": 128}).name == "mla_prefill_triton"
    assert lk.select_kernel("gemm", "fp8_block", torch.float8_e4m3fn, platform=platform).spec.solution != "reference"
    assert lk.select_kernel("moe", "fused_experts_fp8", torch.bfloat16, platform=platform).name == \
        "triton_fused_experts_fp8"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_decode_under_cuda_graphs_equals_eager(tmp_path, fp8):
    runner, sched = _engine(tmp_path, fp8)
    assert runner.graphs is not None, "CUDA graph capture failed (see the lightspeed.runner warning)"
    rng = np.random.default_rng(0)
    _submit(runner, sched, [rng.integers(0, 4096, n).tolist() for n in (100, 700, 1300)])
    compared = []

    def both(plan, t):
        eager = runner.forward_eager(plan, t).clone()
        if not runner.graphs.can_run(plan):
            return eager
        replayed = runner.graphs.forward(plan, t).clone()
        compared.append(_rel(replayed, eager))
        return replayed

    _steps(runner, sched, both)
    assert len(compared) >= 3 and runner.graphs.num_replays >= len(compared)
    assert max(compared) < 1e-2, compared  # same kernels; the graph's split count differs (wider page table)


def test_registry_kernels_agree_with_references(tmp_path):
    import lightspeed_kernel as lk

    runner, sched = _engine(tmp_path, fp8=False, enforce_eager=True)
    overrides = {f"{s.family}/{s.mode}": s.name for s in lk.REGISTRY.specs() if s.solution == "reference"}
    backend = runner.model.model.mla_backend
    rng = np.random.default_rng(1)
    _submit(runner, sched, [rng.integers(0, 4096, n).tolist() for n in (40, 300)], max_tokens=3)
    diffs = []

    def both(plan, t):
        fast = runner.forward_eager(plan, t).clone()
        kernels, backend._kernels = backend._kernels, {}  # the MLA layers pick their kernels once: re-pick
        with lk.override(**overrides):
            ref = runner.forward_eager(plan, t)
        backend._kernels = kernels
        diffs.append(_rel(fast, ref))
        return fast

    assert _steps(runner, sched, both) >= 3
    assert max(diffs) < 3e-2, diffs  # bf16: rounding order differs


def test_engine_loop_with_graphs_fp8(tmp_path):
    """The whole overlapped engine loop on the FP8 model with its FP8 latent cache and host tier."""
    from engine_driver import make_engine, run_until_idle, submit
    from lightspeed.core.messages import SamplingSpec

    (tmp_path / "config.json").write_text(json.dumps({**SMALL_V3, "quantization_config": FP8}))
    engine = make_engine(str(tmp_path), device="cuda", dtype="bfloat16", kv_cache_dtype="fp8",
                         kv_cache_memory="1GiB", host_cache_memory="256MiB", max_num_seqs=8, max_model_len=2048,
                         page_size=64, cuda_graph_max_batch_size=8)
    rng = np.random.default_rng(2)
    for i, n in enumerate((64, 500, 1200)):
        submit(engine, f"r{i}", rng.integers(0, 4096, n).tolist(),
               SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True))
    run = run_until_idle(engine)
    assert all(len(t) == 16 for t in run.tokens.values()) and engine.runner.graphs.num_replays > 0


def _flashinfer_mla_selected() -> None:
    """Skip without FlashInfer's MLA on sm_90; with them, bf16 caches must get it (PLUGIN + 2)."""
    import lightspeed_kernel as lk

    pytest.importorskip("flashinfer.mla")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("mla_decode_flashinfer is registered for sm_90 only")
    chosen = lk.select_kernel("mla", "decode", torch.bfloat16, platform=lk.current_platform(),
                              traits={"page_size": 64, "kv_dtype": "bf16"})
    assert chosen.name == "mla_decode_flashinfer", chosen.name


def test_flashinfer_mla_decode_replanned_in_cuda_graphs_equals_eager(tmp_path):
    """FlashInfer's MLA decode served inside the decode graphs: one host plan before each replay, the
    replayed logits those of the eager step (which plans FlashInfer from the scheduler's host lengths)."""
    _flashinfer_mla_selected()
    runner, sched = _engine(tmp_path, fp8=False)
    graphs = runner.graphs
    assert graphs is not None, "CUDA graph capture failed (see the lightspeed.runner warning)"
    assert sorted(graphs._host_plans) == [(s, 1) for s in graphs.batch_sizes]  # every graph is host-planned
    planner = next(iter(graphs._host_plans.values())).plans[0].runner
    rng = np.random.default_rng(4)
    _submit(runner, sched, [rng.integers(0, 4096, n).tolist() for n in (100, 700, 1300, 64, 2000)], max_tokens=12)
    compared = []

    def both(plan, t):
        eager = runner.forward_eager(plan, t).clone()
        if not graphs.can_run(plan):
            return eager
        before = planner.plans
        replayed = graphs.forward(plan, t).clone()
        assert planner.plans == before + 1  # one host plan for every layer of the step
        compared.append(_rel(replayed, eager))
        return replayed

    _steps(runner, sched, both)
    assert len(compared) >= 8, compared
    assert max(compared) < 1e-2, compared


def test_engine_loop_with_flashinfer_mla_in_graphs(tmp_path):
    """The overlapped engine loop (step N+1 planned on the host while step N runs) with FlashInfer's MLA
    decode in the graphs: every request completes and decode steps replay, one host plan each."""
    from engine_driver import make_engine, run_until_idle, submit
    from lightspeed.core.messages import SamplingSpec

    _flashinfer_mla_selected()
    (tmp_path / "config.json").write_text(json.dumps(SMALL_V3))
    engine = make_engine(str(tmp_path), device="cuda", dtype="bfloat16", kv_cache_memory="1GiB", host_cache_memory=0,
                         max_num_seqs=8, max_model_len=2048, page_size=64, cuda_graph_max_batch_size=8, seed=5)
    graphs = engine.runner.graphs
    planner = next(iter(graphs._host_plans.values())).plans[0].runner
    plans_before = planner.plans
    rng = np.random.default_rng(6)
    for i, n in enumerate((64, 500, 1200, 90, 1800, 33)):
        submit(engine, f"r{i}", rng.integers(0, 4096, n).tolist(),
               SamplingSpec(max_tokens=24, temperature=0.0, ignore_eos=True))
    run = run_until_idle(engine)
    assert sorted(run.tokens) == [f"r{i}" for i in range(6)] and all(len(t) == 24 for t in run.tokens.values())
    assert run.overlapped_steps > 0 and graphs.num_replays > 0
    assert planner.plans - plans_before >= graphs.num_replays  # replays plus the eager steps' plans
