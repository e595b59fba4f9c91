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


def _engine(tmp_path, fp8: bool, enforce_eager: bool = False):
    from lightspeed.config import EngineConfig
    from lightspeed.runner.factory import build_model_runner
    from lightspeed_scheduler import Scheduler, SchedulerConfig

    config = {**SMALL_V3, **({"quantization_config": FP8} if fp8 else {})}
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = EngineConfig(model=str(tmp_path), load_format="dummy", device="cuda", dtype="bfloat16",
                       kv_cache_dtype="fp8" if fp8 else "auto", kv_cache_memory="1GiB", max_num_seqs=8,
                       max_model_len=2048, page_size=64, cuda_graph_max_batch_size=8, enable_prefix_cache=False,
                       enforce_eager=enforce_eager, seed=3)
    built = build_model_runner(cfg)
    sched = Scheduler(SchedulerConfig(
        page_size=cfg.page_size, num_device_pages=built.num_device_pages, num_host_pages=built.num_host_pages,
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        chunked_prefill_size=cfg.chunked_prefill_size, max_model_len=built.max_model_len, enable_prefix_cache=False))
    built.runner._output_tokens_of = sched.output_token_ids
    return built, sched


def _submit(built, sched, prompts, max_tokens=8):
    from lightspeed.core.messages import SamplingSpec
    from lightspeed_scheduler import RequestSpec

    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        rid = sched.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=max_tokens, ignore_eos=True))
        built.runner.add_request(rid, spec, prompt)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_registry_picks_the_triton_mla_and_fp8_kernels():
    import lightspeed_kernel as lk

    platform = lk.current_platform()
    assert lk.select_kernel("mla", "decode", torch.bfloat16, platform=platform,
                            traits={"page_size": 64, "kv_dtype": "fp8"}, features=("paged", "fp8_kv")).name == \
        "mla_decode_triton"
    assert lk.select_kernel("mla", "store", torch.bfloat16, platform=platform).name == "mla_store_triton"
    assert lk.select_kernel("mla", "prefill", torch.bfloat16, platform=platform,
                            traits={"head_dim_qk": 192, "head_dim_v": 128}).name == "mla_prefill_triton"
    assert lk.select_kernel("gemm", "fp8_block", torch.float8_e4m3fn, platform=platform).solution != "reference"
    assert lk.select_kernel("moe", "fused_experts_fp8", torch.bfloat16, platform=platform).name == \
        "triton_fused_experts_fp8"


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_decode_under_cuda_graphs_equals_eager(tmp_path, fp8):
    built, sched = _engine(tmp_path, fp8)
    runner = built.runner
    assert runner.graphs is not None, "CUDA graph capture failed (see the lightspeed.runner warning)"
    rng = np.random.default_rng(0)
    _submit(built, sched, [rng.integers(0, 4096, n).tolist() for n in (100, 700, 1300)])
    compared = 0
    while sched.has_unfinished():
        plan = sched.next_plan()
        if plan.num_prefills == 0 and runner.graphs.can_run(plan):
            t = runner.inputs.build(plan, runner._prev_sampled)
            with torch.inference_mode():
                graph_logits = runner.forward(plan, t).clone()
                eager_logits = runner.forward_eager(plan, t)
            assert _rel(graph_logits, eager_logits) < 1e-3
            compared += 1
        result = runner.execute(plan)
        sched.advance(plan, result.tokens)
    assert compared >= 3 and runner.graphs.num_replays >= compared


def test_registry_kernels_agree_with_references(tmp_path):
    import lightspeed_kernel as lk

    built, sched = _engine(tmp_path, fp8=False, enforce_eager=True)
    runner = built.runner
    overrides = {f"{s.family}/{s.mode}": s.name for s in lk.REGISTRY.specs() if s.solution == "reference"}
    rng = np.random.default_rng(1)
    _submit(built, sched, [rng.integers(0, 4096, n).tolist() for n in (40, 300)], max_tokens=3)
    steps = 0
    while sched.has_unfinished():
        plan = sched.next_plan()
        t = runner.inputs.build(plan, runner._prev_sampled)
        with torch.inference_mode():
            fast = runner.forward_eager(plan, t).clone()
            # The MLA backend caches its kernel choice: a fresh model-side cache for the reference pass.
            kernels = runner.model.model.mla_backend._kernels
            runner.model.model.mla_backend._kernels = {}
            with lk.override(**overrides):
                ref = runner.forward_eager(plan, t)
            runner.model.model.mla_backend._kernels = kernels
        assert _rel(fast, ref) < 3e-2, f"step {steps}"  # bf16: rounding order differs
        result = runner.execute(plan)
        sched.advance(plan, result.tokens)
        steps += 1
    assert steps >= 3
