"""Model building blocks: tensor-parallel linear / embedding / LM head with placements, RMSNorm,
rotary embedding, gated activation, paged attention, multi-head latent attention and fused MoE
(tensor or expert parallel), and the placement compiler that inserts their collectives.
All compute goes through `lightspeed_kernel.ops` (MLA: the `mla/*` registry family)."""

from .activation import SiluAndMul
from .attention import Attention, AttentionMetadata
from .embedding import ParallelLMHead, VocabParallelEmbedding
from .linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
    default_weight_loader,
)
from .mla import MLAAttention, MLABackend, mla_softmax_scale
from .moe import FusedMoE, MoEGate
from .norm import RMSNorm
from .parallel import (
    ParallelContext,
    ParallelLayout,
    Partial,
    Placement,
    Replicate,
    Shard,
    redistribute,
    split_sizes,
)
from .placement import StepTokens, compile_placements, describe_placements
from .rotary import RotaryEmbedding

__all__ = [
    "Attention",
    "AttentionMetadata",
    "ColumnParallelLinear",
    "FusedMoE",
    "MLAAttention",
    "MLABackend",
    "MoEGate",
    "MergedColumnParallelLinear",
    "ParallelContext",
    "ParallelLayout",
    "ParallelLMHead",
    "Partial",
    "Placement",
    "QKVParallelLinear",
    "RMSNorm",
    "Replicate",
    "ReplicatedLinear",
    "RotaryEmbedding",
    "RowParallelLinear",
    "Shard",
    "SiluAndMul",
    "StepTokens",
    "VocabParallelEmbedding",
    "compile_placements",
    "default_weight_loader",
    "describe_placements",
    "mla_softmax_scale",
    "redistribute",
    "split_sizes",
]
