"""The engine on CUDA (`pytest -m gpu`, skipped without CUDA): registry kernels (Triton) give what
the torch references give; the LLM API; asynchronous KV copies through the CUDA copier."""

import time

import numpy as np
import pytest
import torch
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec

pytestmark = pytest.mark.gpu

PROMPTS = [list(range(3, 40)), list(range(100, 105)), list(range(7, 90))]


def _reference_overrides() -> dict[str, str]:
    import lightspeed_kernel as lk

    return {f"{s.family}/{s.mode}": s.name for s in lk.REGISTRY.specs() if s.solution == "reference"}


def _greedy(engine, prompts, max_tokens):
    for i, prompt in enumerate(prompts):
        submit(engine, f"r{i}", prompt, SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    run = run_until_idle(engine)
    return [run.tokens[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_triton_greedy_equals_reference(tiny_model_dir, kv_cache_dtype):
    import lightspeed_kernel as lk

    runs = []
    for forced in (None, _reference_overrides()):
        # The reference run is eager: CUDA graphs replay the kernels they were captured with.
        engine = make_engine(tiny_model_dir, device="cuda", dtype="bfloat16", kv_cache_dtype=kv_cache_dtype,
                             enforce_eager=forced is not None)
        if forced is None:
            runs.append(_greedy(engine, PROMPTS, 8))
        else:
            with lk.override(**forced):
                runs.append(_greedy(engine, PROMPTS, 8))
        torch.cuda.synchronize()
    fast, ref = runs
    assert fast == ref, f"registry vs reference greedy: {fast} vs {ref}"


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "tiny-qwen3-moe"])
def test_triton_path_matches_reference_path_greedy_on_presets(preset):
    """fp32 keeps the two paths' rounding apart from the argmax: any token difference is a kernel bug.
    Lengths straddle page boundaries; the longest prompts are prefilled in 128-token chunks."""
    import lightspeed_kernel as lk

    torch.backends.cuda.matmul.allow_tf32 = False
    settings = dict(device="cuda", dtype="float32", max_model_len=512, max_num_seqs=4, max_num_batched_tokens=128,
                    chunked_prefill_size=128, enable_prefix_cache=False, kv_cache_memory="1GiB")
    gen = torch.Generator().manual_seed(0)
    fast_engine = make_engine(preset, **settings)
    vocab = fast_engine.vocab_size
    prompts = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (1, 17, 300, 450)]
    fast = _greedy(fast_engine, prompts, 12)
    del fast_engine
    with lk.override(**_reference_overrides()):
        slow = _greedy(make_engine(preset, enforce_eager=True, **settings), prompts, 12)
    assert fast == slow


def test_cuda_copier_moves_page_runs_exactly(tiny_model_dir):
    """cudaMemcpy2DAsync between the device pool and the pinned host pool, runs and single pages,
    bf16 and fp8, then back: bit-exact; completion seen by polling its event."""
    from lightspeed.kv import CudaPageCopier, KVCache, KVLayout

    for dtype in (torch.bfloat16, torch.float8_e4m3fn):
        cache = KVCache(KVLayout(4, 2, 64, 16, dtype), num_device_pages=64, num_host_pages=48, device="cuda")
        assert isinstance(cache.copier, CudaPageCopier) and cache.copier._memcpy2d is not None
        assert cache.host_pool.buffer.is_pinned()
        dev = cache.device_pool.buffer
        dev.copy_(torch.randn(dev.shape, device="cuda").to(dtype))
        before = dev.clone()
        out = np.array([[5, 1], [6, 2], [7, 3], [20, 30], [40, 9], [41, 10]])
        cache.copier.submit(1, out, np.empty((0, 2), np.int32), False)
        back = np.array([[1, 50], [2, 51], [3, 52], [30, 11], [9, 60], [10, 12]])
        cache.copier.submit(2, np.empty((0, 2), np.int32), back, False)
        done = []
        while len(done) < 2:
            done += cache.copier.poll()
        assert done == [1, 2]
        host = cache.host_pool.buffer
        for d, h in out.tolist():
            assert torch.equal(host[:, h].view(torch.uint8), before[:, d].cpu().view(torch.uint8))
        for (d_src, _), (_, d_dst) in zip(out.tolist(), back.tolist(), strict=True):
            assert torch.equal(dev[:, d_dst].view(torch.uint8), before[:, d_src].view(torch.uint8))


def test_cuda_copier_starts_after_the_streams_it_is_told_to_follow():
    """A plan's copies wait for the result stream's queued work (`copy_after`), so a step's token copy is queued
    on the copy engine before the next plan's KV pages, not behind them."""
    from lightspeed.kv import KVCache, KVLayout

    cache = KVCache(KVLayout(2, 2, 64, 16, torch.bfloat16), num_device_pages=16, num_host_pages=16, device="cuda")
    results = torch.cuda.Stream()
    cache.copier.copy_after(results)
    with torch.cuda.stream(results):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of a busy result stream
    cache.copier.submit(1, np.array([[1, 2]]), np.empty((0, 2), np.int32), False)
    time.sleep(0.02)  # ample for one page's copy, were it not waiting
    assert cache.copier.poll() == []  # still waiting for the result stream
    results.synchronize()
    assert cache.copier.wait_all() == [1]


def test_cuda_copier_loads_back_beside_a_long_write_back():
    """Load-backs have a copy stream of their own: one page loaded back lands while a later-finishing 1 GiB
    write-back of an earlier plan still runs (one stream would have queued it behind), and poll() still reports
    the plans in order."""
    from lightspeed.kv import KVCache, KVLayout

    layout = KVLayout(32, 8, 128, 16, torch.bfloat16)  # 2 MiB pages, the 8B shape's
    cache = KVCache(layout, num_device_pages=600, num_host_pages=600, device="cuda")
    cache.copier.submit(1, np.array([[d, d] for d in range(1, 513)]), np.empty((0, 2), np.int32), False)
    cache.copier.submit(2, np.empty((0, 2), np.int32), np.array([[550, 550]]), False)
    (_, (write_1, _)), (_, (_, load_2)) = cache.copier._in_flight
    load_2.synchronize()
    assert not write_1.query()  # the write-back is still running
    assert cache.copier.poll() == []  # plan 1 first: plan 2 is not reported before it
    assert cache.copier.wait_all() == [1, 2]


def test_host_tier_on_gpu_reproduces_outputs(tiny_model_dir):
    """Prefixes pushed off a tiny device pool come back from host through the CUDA copier."""
    engine = make_engine(tiny_model_dir, device="cuda", dtype="float32", kv_cache_memory=48 * 4096,
                         host_cache_memory=256 * 4096, max_num_seqs=2, enforce_eager=True)
    first = list(range(10, 170))
    outs = []
    for i, prompt in enumerate((first, list(range(300, 460)), list(range(600, 760)), first)):
        submit(engine, f"p{i}", prompt, SamplingSpec(max_tokens=6, temperature=0.0, ignore_eos=True))
        run = run_until_idle(engine)
        outs.append(run.tokens[f"p{i}"])
    assert run.cached["p3"] >= 144 and outs[3] == outs[0]


def test_llm_on_gpu(tiny_model_dir, default_model_path):
    from lightspeed import LLM, SamplingParams

    with LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, device="cuda",
             kv_cache_memory="64MiB", max_model_len=256) as llm:
        outs = llm.generate(["Hello", "GPU"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]
        seeded = SamplingParams(temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
        assert llm.generate("x", seeded)[0].outputs[0].token_ids == llm.generate("x", seeded)[0].outputs[0].token_ids


def test_launch_never_waits_for_the_gpu_with_every_sampling_table(tiny_model_dir):
    """The pre-sized per-request tables (penalties, logit bias, min_tokens stop ids) and logprobs on the
    step path: after the first steps (which bind the rows), launching a step never syncs the host."""
    engine = make_engine(tiny_model_dir, device="cuda", dtype="bfloat16", enforce_eager=True)
    specs = [SamplingSpec(max_tokens=16, temperature=0.0, ignore_eos=True),
             SamplingSpec(max_tokens=16, temperature=0.8, seed=3, presence_penalty=0.5, repetition_penalty=1.2,
                          logit_bias={5: 2.0, 9: -3.0}, min_tokens=4, stop_token_ids=[7], eos_token_ids=[2]),
             SamplingSpec(max_tokens=16, temperature=0.0, logprobs=3, ignore_eos=True)]
    for i, (prompt, spec) in enumerate(zip(PROMPTS, specs, strict=True)):
        submit(engine, f"r{i}", prompt, spec)
    for _ in range(4):  # prefills and the steps that bind the rows
        engine.step()
    launch = engine.runner.launch

    def checked(plan):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(plan)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    engine.runner.launch = checked
    run = run_until_idle(engine)
    assert not run.errors, run.errors  # a sync would have raised in launch and failed the step's requests
    assert engine._guard.num_failed_steps == 0
