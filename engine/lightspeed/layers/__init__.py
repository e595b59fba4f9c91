"""Model building blocks: tensor-parallel linear / embedding / LM head with placements, RMSNorm,
rotary embedding, gated activation, paged attention and fused MoE. All compute goes through
`lightspeed_kernel.ops`."""

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
from .moe import FusedMoE
from .norm import RMSNorm
from .parallel import ParallelContext, Partial, Placement, Replicate, Shard, redistribute
from .rotary import RotaryEmbedding

__all__ = [
    "Attention",
    "AttentionMetadata",
    "ColumnParallelLinear",
    "FusedMoE",
    "MergedColumnParallelLinear",
    "ParallelContext",
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
    "VocabParallelEmbedding",
    "default_weight_loader",
    "redistribute",
]
