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
from .prefill import choose_prefill_form, gather_latent, mla_prefill, prefill_flops
from .reference import mla_decode_reference, mla_prefill_reference
from .tuning import DecodeTile, PrefillTile

__version__ = "0.1.0"

__all__ = [
    "D_LATENT",
    "D_PACKED",
    "D_ROPE",
    "DecodeTile",
    "MLACache",
    "MLADecodePlan",
    "PrefillTile",
    "choose_prefill_form",
    "decode_workspace_bytes",
    "gather_latent",
    "mla_decode",
    "mla_decode_reference",
    "mla_prefill",
    "mla_prefill_reference",
    "pack_kv",
    "pack_kv_reference",
    "plan_decode",
    "prefill_flops",
    "quantize_latent_fp8",
    "run_decode",
    "should_fold",
]
