"""Every registered implementation honours its public op's signature (kernel/README.md contract),
and the references are fast enough to run a small model on the CPU."""

import importlib.util
import inspect
import time

import lightspeed_kernel as lk
import pytest
import torch
from lightspeed_kernel import ops

OPS = {
    ("norm", "rms"): ops.rms_norm,
    ("norm", "fused_add_rms"): ops.fused_add_rms_norm,
    ("norm", "rms_linear"): ops.rms_norm_linear,
    ("rope", "rotary"): ops.apply_rope,
    ("activation", "silu_and_mul"): ops.silu_and_mul,
    ("activation", "gelu_and_mul"): ops.gelu_and_mul,
    ("activation", "silu_and_mul_linear"): ops.silu_and_mul_linear,
    ("kv_store", "paged"): ops.store_kv,
    ("kv_store", "rope_paged"): ops.rope_store_kv,
    ("memory", "host_copy"): ops.host_copy,
    ("attention", "prefill"): ops.attention_prefill,
    ("attention", "decode"): ops.attention_decode,
    ("gemm", "bf16"): ops.linear,
    ("gemm", "fp8_block"): ops.fp8_block_gemm,
    ("gemm", "w4"): ops.linear_w4,
    ("gemm", "w8"): ops.linear_w8,
    ("gemm", "w4_dequant"): ops.dequantize_w4,
    ("gemm", "w8_dequant"): ops.dequantize_w8,
    ("moe", "topk"): ops.moe_topk,
    ("moe", "fused_experts"): ops.fused_experts,
    ("quantize", "fp8_per_token"): ops.quant_fp8_per_token,
    ("quantize", "fp8_per_block"): ops.quant_fp8_per_block,
    ("quantize", "fp8_per_token_head"): ops.quant_fp8_per_token_head,
    ("sampling", "penalties"): ops.apply_penalties,
    ("sampling", "sample"): ops.sample,
    ("sampling", "logprobs"): ops.compute_logprobs,
    ("sampling", "greedy"): ops.greedy,
    ("spec", "ngram_lookup"): ops.ngram_lookup,
    ("spec", "ngram_record"): ops.ngram_record,
    ("spec", "verify"): ops.spec_verify,
    ("spec", "shift_rows"): ops.spec_shift_rows,
    ("spec", "fill_drafts"): ops.spec_fill_drafts,
}


def _kernels():
    return [spec for spec in lk.list_kernels() if (spec.family, spec.mode) in OPS]


@pytest.mark.parametrize("spec", _kernels(), ids=lambda s: f"{s.key}:{s.name}")
def test_implementation_accepts_the_op_signature(spec):
    assert_honours_op_signature(spec)


def assert_honours_op_signature(spec):
    """Same parameter names, kinds and defaults as the public op; extras only with defaults."""
    op_params = list(inspect.signature(OPS[spec.family, spec.mode]).parameters.values())
    impl_params = inspect.signature(spec.impl).parameters
    for param in op_params:
        assert param.name in impl_params, f"{spec.name} lacks parameter {param.name}"
        got = impl_params[param.name]
        assert got.kind == param.kind and got.default == param.default, (
            f"{spec.name}.{param.name}: {got} vs {param}"
        )
    extra = [p for p in impl_params.values() if p.name not in {q.name for q in op_params}]
    assert all(p.default is not inspect.Parameter.empty for p in extra), (
        f"{spec.name}: required extras {extra}"
    )


def test_optional_backends_are_covered_when_installed():
    # FlashInfer's kernels register (and are checked by the test above) wherever the library is
    # installed; test_flashinfer.py checks the same adapter over a stand-in library everywhere.
    from lightspeed_kernel import flashinfer

    if importlib.util.find_spec("flashinfer") is None:
        pytest.skip("flashinfer not installed")
    names = {spec.name for spec in _kernels()}
    assert {flashinfer.DECODE_KERNEL, flashinfer.PREFILL_KERNEL} <= names, flashinfer.IMPORT_ERROR


def test_every_op_has_a_reference():
    refs = {(s.family, s.mode) for s in lk.list_kernels() if s.solution == "reference"}
    assert set(OPS) <= refs


def test_attention_reference_is_fast_enough_for_a_small_model():
    # SmolLM2-135M: 30 layers, 9 q heads, 3 kv heads, head dim 64; a 256-token prompt. Per-token
    # Python loops would take many seconds; vectorised it is ~0.1-0.3 s. CPU time of one thread,
    # so other processes on the machine (and OpenMP spin-waits) do not count.
    layers, tokens, page_size = 30, 256, 16
    pages = tokens // page_size
    k_cache = torch.randn(pages + 1, page_size, 3, 64, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    page_table = torch.arange(1, pages + 1, dtype=torch.int32)[None]
    q = torch.randn(tokens, 9, 64, dtype=torch.bfloat16)
    qsl = torch.tensor([0, tokens], dtype=torch.int32)
    seq_lens = torch.tensor([tokens], dtype=torch.int32)
    decode_q = torch.randn(8, 9, 64, dtype=torch.bfloat16)
    decode_args = (
        k_cache,
        v_cache,
        page_table.repeat(8, 1),
        torch.arange(9, dtype=torch.int32),
        seq_lens.repeat(8),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ops.attention_prefill(
            q, k_cache, v_cache, page_table, qsl, seq_lens, max_query_len=tokens, scale=0.125
        )
        start = time.process_time()
        for _ in range(layers):
            ops.attention_prefill(
                q, k_cache, v_cache, page_table, qsl, seq_lens, max_query_len=tokens, scale=0.125
            )
        prefill_s = time.process_time() - start
        start = time.process_time()
        for _ in range(layers):
            ops.attention_decode(decode_q, *decode_args, max_query_len=1, scale=0.125)
        decode_s = time.process_time() - start
    finally:
        torch.set_num_threads(threads)
    assert prefill_s < 2.0, f"30 layers of prefill attention took {prefill_s:.2f} s of CPU"
    assert decode_s < 1.0, f"30 layers of decode attention took {decode_s:.2f} s of CPU"


@pytest.mark.gpu
def test_cuda_platform_detected():
    platform = lk.platform_of(torch.device("cuda"))
    assert platform.device_type == "cuda" and platform.sm_count > 0 and platform.name
    assert platform.compute_capability >= (7, 0)
    assert lk.current_platform() == platform
