"""GPU first light (`pytest -m gpu`, skipped without CUDA): registry kernels (Triton) vs torch references."""

import pytest
import torch
from lightspeed.core.messages import SamplingSpec
from test_runner import PROMPTS, _engine, _run_sync, _submit

pytestmark = pytest.mark.gpu


def _reference_overrides() -> dict[str, str]:
    import lightspeed_kernel as lk

    return {f"{s.family}/{s.mode}": s.name for s in lk.REGISTRY.specs() if s.solution == "reference"}


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_triton_greedy_equals_reference(tiny_model_dir, kv_cache_dtype):
    import lightspeed_kernel as lk

    spec = SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True)
    runs = []
    for forced in (None, _reference_overrides()):
        # The reference run is eager: CUDA graphs replay the kernels they were captured with.
        runner, sched = _engine(tiny_model_dir, device="cuda", dtype="bfloat16", kv_cache_dtype=kv_cache_dtype,
                                enforce_eager=forced is not None)
        ids = _submit(runner, sched, PROMPTS, spec)
        if forced is None:
            out = _run_sync(runner, sched)
        else:
            with lk.override(**forced):
                out = _run_sync(runner, sched)
        runs.append([out[i] for i in ids])
        torch.cuda.synchronize()
    fast, ref = runs
    agree = sum(a == b for a, b in zip(fast, ref, strict=True))
    assert agree == len(PROMPTS), f"registry vs reference greedy: {fast} vs {ref}"


def test_llm_on_gpu(tiny_model_dir, default_model_path):
    from lightspeed import LLM, SamplingParams

    with LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, device="cuda",
             kv_cache_memory="64MiB", max_model_len=256) as llm:
        outs = llm.generate(["Hello", "GPU"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]
        seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
        assert llm.generate("x", seeded)[0].outputs[0].token_ids == llm.generate("x", seeded)[0].outputs[0].token_ids
