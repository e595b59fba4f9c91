"""GPU first light: the engine on CUDA with the registry's kernels (Triton) generates exactly what
it generates with every op forced to its torch reference. Runs only where CUDA exists (`-m gpu`)."""

import pytest
import torch

pytestmark = pytest.mark.gpu


def _greedy(runner_bundle, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from lightspeed.core.messages import SamplingSpec
    from lightspeed_scheduler import RequestSpec, Scheduler, SchedulerConfig

    built, config = runner_bundle
    scheduler = Scheduler(SchedulerConfig(
        page_size=config.page_size, num_device_pages=built.num_device_pages, num_host_pages=built.num_host_pages,
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        chunked_prefill_size=config.chunked_prefill_size, max_model_len=built.max_model_len,
        policy="decode_first", enable_prefix_cache=False))
    spec = SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        rid = scheduler.submit(RequestSpec(rid=f"r{i}", token_ids=prompt, max_new_tokens=max_tokens, ignore_eos=True))
        built.runner.add_request(rid, spec, prompt)
        outputs[rid] = []
    live = set(outputs)
    while live:
        plan = scheduler.next_plan()
        result = built.runner.execute(plan)
        finished = scheduler.advance(plan, result.tokens)
        for rid, tok in zip(result.req_ids.tolist(), result.tokens.tolist(), strict=True):
            outputs[rid].append(tok)
        for rid, _ in finished:
            live.discard(rid)
            built.runner.remove_request(rid)
    return [outputs[k] for k in sorted(outputs)]


@pytest.mark.parametrize("preset", ["llama-3.2-1b", "tiny-qwen3-moe"])
def test_triton_path_matches_reference_path_greedy(preset, device="cuda"):
    import lightspeed_kernel as lk
    from lightspeed.config import EngineConfig
    from lightspeed.runner.factory import build_model_runner

    # fp32 keeps the two paths' rounding apart from the argmax: any token difference is a kernel bug.
    torch.backends.cuda.matmul.allow_tf32 = False
    config = EngineConfig(model=preset, load_format="dummy", dtype="float32", device=device, max_model_len=512,
                          max_num_seqs=4, max_num_batched_tokens=128, chunked_prefill_size=128, page_size=16,
                          enable_prefix_cache=False)
    built = build_model_runner(config)
    gen = torch.Generator().manual_seed(0)
    vocab = built.model_config.vocab_size
    # Lengths straddle page boundaries; the longest prompts are prefilled in 128-token chunks.
    prompts = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (1, 17, 300, 450)]
    fast = _greedy((built, config), prompts, max_tokens=12)
    refs = {f"{s.family}/{s.mode}": s.name for s in lk.REGISTRY.specs() if s.solution == "reference"}
    with lk.override(**refs):
        slow = _greedy((built, config), prompts, max_tokens=12)
    assert fast == slow
