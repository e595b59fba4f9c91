"""lightspeed_mla: multi-head latent attention kernels (absorbed decode, prefill, cache packing)."""

from .cache import D_LATENT, D_PACKED, D_ROPE, MLACache, pack_kv, pack_kv_reference, quantize_latent_fp8
from .decode import (
    MLADecodePlan,
    decode_workspace_bytes,
    mla_decode,
    plan_decode,
    run_decode,
    should_fold,
)
from .reference import mla_decode_reference, mla_prefill_reference

__version__ = "0.1.0"

__all__ = [
    "D_LATENT",
    "D_PACKED",
    "D_ROPE",
    "MLACache",
    "MLADecodePlan",
    "decode_workspace_bytes",
    "mla_decode",
    "mla_decode_reference",
    "mla_prefill_reference",
    "pack_kv",
    "pack_kv_reference",
    "plan_decode",
    "quantize_latent_fp8",
    "run_decode",
    "should_fold",
]
