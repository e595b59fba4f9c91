"""Public ops: each dispatches through the kernel registry on its input's dtype and device.

Shapes and semantics are the contract in kernel/README.md; every implementation of a
family/mode (reference, Triton, plugins) takes exactly these arguments.
"""

from .activation import gelu_and_mul, silu_and_mul, silu_and_mul_linear
from .attention import HostLengths, attention_decode, attention_prefill
from .gemm import (
    dequantize,
    dequantize_w4,
    dequantize_w8,
    embedding,
    fp8_block_gemm,
    linear,
    linear_quantized,
    linear_w4,
    linear_w8,
)
from .kv_store import rope_store_kv, store_kv
from .memory import host_copy
from .moe import fused_experts, fused_experts_fp8, moe_topk
from .norm import fused_add_rms_norm, rms_norm, rms_norm_linear
from .quantize import quant_fp8_per_block, quant_fp8_per_token, quant_fp8_per_token_head
from .rope import apply_rope, rope_cos_sin_cache, yarn_get_mscale
from .sampling import apply_penalties, compute_logprobs, greedy, sample
from .spec import ngram_lookup, ngram_record, spec_fill_drafts, spec_shift_rows, spec_verify

__all__ = [
    "HostLengths",
    "apply_penalties",
    "apply_rope",
    "attention_decode",
    "attention_prefill",
    "compute_logprobs",
    "dequantize",
    "dequantize_w4",
    "dequantize_w8",
    "embedding",
    "fp8_block_gemm",
    "fused_add_rms_norm",
    "fused_experts",
    "fused_experts_fp8",
    "gelu_and_mul",
    "greedy",
    "host_copy",
    "linear",
    "linear_quantized",
    "linear_w4",
    "linear_w8",
    "ngram_lookup",
    "ngram_record",
    "moe_topk",
    "quant_fp8_per_block",
    "quant_fp8_per_token",
    "quant_fp8_per_token_head",
    "rms_norm",
    "rms_norm_linear",
    "rope_cos_sin_cache",
    "rope_store_kv",
    "sample",
    "silu_and_mul",
    "silu_and_mul_linear",
    "spec_fill_drafts",
    "spec_shift_rows",
    "spec_verify",
    "store_kv",
    "yarn_get_mscale",
]
