"""Greedy generations of the engine equal transformers' on SmolLM2 (same GGUF weights, CPU): the engine
runs its CPU default (the file's Q4_1 / Q8_0 blocks on the native w4 / w8 kernels, fp32 activations),
transformers the same weights dequantised to fp32."""

import inspect

import torch
from lightspeed import LLM, SamplingParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write a haiku about the ocean.",
    "List three primary colors:",
    "In 1969, Neil Armstrong",
]
NUM_TOKENS = 64


def cache_kwarg(model) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; use whichever forward() takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


@torch.inference_mode()
def hf_greedy(model, ids: list[int], num_tokens: int) -> list[int]:
    """Greedy decoding that really uses transformers' KV cache (checked at every step)."""
    from transformers import DynamicCache

    kw = cache_kwarg(model)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([ids]), use_cache=True, **{kw: cache})
    generated = []
    for step in range(num_tokens):
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        assert cache.get_seq_length() == len(ids) + step, "the reference loop is not using its KV cache"
        if step + 1 < num_tokens:
            out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{kw: cache})
    return generated


def test_greedy_matches_transformers_and_prefix_cache_hit(smollm2_path, hf_smollm2):
    llm = LLM(smollm2_path, kv_cache_memory="256MiB", max_model_len=1024, max_num_seqs=8, num_threads=1)
    try:
        tok = llm.get_tokenizer()
        prompts = [llm.engine.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
        params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for prompt, out in zip(prompts, outs, strict=False):
            expected = hf_greedy(hf_smollm2, prompt, NUM_TOKENS)
            got = out.outputs[0].token_ids
            assert got == expected, f"diverged at {next(i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b)}:" \
                                    f"\n engine: {tok.decode(got)!r}\n hf:     {tok.decode(expected)!r}"
        # The chat template's system prompt is shared: a second pass hits the prefix cache and
        # must produce the same tokens.
        again = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        for first, second in zip(outs, again, strict=False):
            assert second.num_cached_tokens >= 16
            assert second.outputs[0].token_ids == first.outputs[0].token_ids
        assert llm.stats()["prefix_hit_tokens"] > 0
    finally:
        llm.shutdown()
