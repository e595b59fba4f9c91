"""Model building blocks: tensor-parallel linear / embedding / LM head with placements, RMSNorm,
rotary embedding, gated activation, paged attention, multi-head latent attention and fused MoE.
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
from .parallel import ParallelContext, Partial, Placement, Replicate, Shard, redistribute
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
    "mla_softmax_scale",
    "redistribute",
]
