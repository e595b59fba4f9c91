"""No Triton compile in the middle of serving (`pytest -m gpu`, skipped without CUDA).

Triton compiles one variant per combination of constexprs and of the integer / pointer
specialisations (an int == 1 or divisible by 16, a pointer 16-byte aligned). A kernel argument that
follows the step's shape (rows, tokens, the page-table width, a slice at the decode rows' end)
compiles new variants for as long as new shapes turn up: each a stall of every stream of the
engine, 24% of the core's time in the H200 py-spy of a c = 16 ngram_gpu run. Here a speculative,
overlapped engine serves one mix of arrivals, then a different one: the second must find every
kernel variant it needs already compiled.
"""

import sys

import numpy as np
import pytest
import torch
from engine_driver import make_engine, run_until_idle, submit
from lightspeed.core.messages import SamplingSpec

pytestmark = pytest.mark.gpu
SPEC = {"method": "ngram_gpu", "num_speculative_tokens": 4, "prompt_lookup_min": 1}


def compiled_variants() -> dict[str, int]:
    """Compiled variants of every Triton kernel of lightspeed_kernel loaded so far, by name."""
    from triton.runtime.jit import JITFunction

    counts = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("lightspeed_kernel.triton"):
            continue
        for attr, fn in vars(module).items():
            fn = getattr(fn, "fn", fn)  # an autotuner wraps its JITFunction
            if isinstance(fn, JITFunction):
                caches = getattr(fn, "device_caches", {})
                counts[f"{name}.{attr}"] = sum(len(entry[0]) for entry in caches.values())
    return counts


def _serve(engine, seed: int, waves: list[int]) -> None:
    """Requests arrive in waves (wave i after i * 3 steps) so mixed steps pair prefills with every
    number of decode rows; prompts repeat a random phrase, so the drafter finds matches."""
    rng = np.random.default_rng(seed)
    pending = []
    for wave, count in enumerate(waves):
        for j in range(count):
            phrase = rng.integers(3, 40000, int(rng.integers(4, 30))).tolist()
            prompt = (phrase * int(rng.integers(2, 12)))[: int(rng.integers(8, 900))]
            pending.append((wave * 3, f"s{seed}w{wave}r{j}", prompt, int(rng.integers(8, 60))))

    def arrive(engine, steps: int) -> None:
        while pending and pending[0][0] <= steps:
            _, rid, prompt, max_tokens = pending.pop(0)
            submit(engine, rid, prompt, SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))

    arrive(engine, 0)
    run_until_idle(engine, on_step=lambda engine, run: arrive(engine, run.steps))
    assert not pending


@pytest.fixture(scope="module")
def long_tiny_model_dir(tmp_path_factory):
    """The tiny Llama with room for 2048 positions."""
    import json

    from conftest_models import TINY_LLAMA

    folder = tmp_path_factory.mktemp("tiny-llama-2k")
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, "max_position_embeddings": 2048}))
    return str(folder)


def test_second_mix_of_arrivals_compiles_nothing(long_tiny_model_dir):
    engine = make_engine(long_tiny_model_dir, device="cuda", dtype="bfloat16", speculative_config=SPEC,
                         async_scheduling=True, max_num_seqs=16, max_model_len=2048, kv_cache_memory="256MiB",
                         max_num_batched_tokens=512, chunked_prefill_size=512, cuda_graph_max_batch_size=16)
    _serve(engine, seed=0, waves=[1, 2, 3, 1, 4, 2, 5, 1, 3, 2, 6, 1])
    torch.cuda.synchronize()
    warm = compiled_variants()
    _serve(engine, seed=1, waves=[3, 1, 1, 5, 2, 4, 1, 6, 2, 3, 1, 2])
    torch.cuda.synchronize()
    grew = {k: (warm.get(k, 0), n) for k, n in compiled_variants().items() if n > warm.get(k, 0)}
    assert engine.stats().spec_num_draft_tokens > 0
    assert not grew, f"kernels compiled new variants while serving (before, after): {grew}"
