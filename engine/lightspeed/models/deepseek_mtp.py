"""DeepSeek-V3's multi-token prediction (MTP) module, as a next-token predictor over the main model.

MTP module k (checkpoint layer `num_hidden_layers + k`) combines the main model's final hidden
state at position i with the embedding of token i+1 and predicts token i+2:

    h' = eh_proj([enorm(embed(t_{i+1})) ‖ hnorm(h_i)]);  h'' = decoder layer(h');  logits = head(norm(h''))

The decoder layer is a full DeepSeek layer (MLA + MoE); its attention caches into
`meta.kv_caches[num_hidden_layers + k]`, so a pool that serves the MTP module holds
`num_hidden_layers + num_nextn_predict_layers` layers. The embedding and LM head are the main
model's: DeepSeek-V3's checkpoint stores identical copies under layer 61, which are skipped.
`eh_proj` is bf16 in the FP8 checkpoint, so it is never quantised. This is the draft model the
speculative-decoding work builds on (`loader.load_mtp` builds and loads it).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ..layers import AttentionMetadata, ReplicatedLinear, RMSNorm
from .deepseek_v2 import DEEPSEEK_STACKED_PARAMS, DeepseekDecoderLayer, DeepseekV2ForCausalLM
from .weights import load_stacked_weights, route_expert_weights

_SHARED_COPIES = ("embed_tokens.", "shared_head.head.")  # the main model's, stored again in layer 61


class DeepseekMTP(nn.Module):
    """`forward(input_ids [T], positions [T], previous_hidden [T, H], meta) -> hidden [T, H]`,
    `compute_logits(hidden [S, H]) -> float32 [S, V]` (the main model's head)."""

    def __init__(self, main: DeepseekV2ForCausalLM, depth: int = 0):
        super().__init__()
        config = main.config
        if not 0 <= depth < config.num_nextn_predict_layers:
            raise ValueError(f"model config {config.name!r}: MTP module {depth} does not exist "
                             f"(num_nextn_predict_layers={config.num_nextn_predict_layers})")
        self.config, self.layer_idx = config, config.num_hidden_layers + depth
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.enorm, self.hnorm = RMSNorm(hidden, eps), RMSNorm(hidden, eps)
        self.eh_proj = ReplicatedLinear(2 * hidden, hidden, bias=False)
        self.eh_proj.quantizable = False
        self.mtp_block = DeepseekDecoderLayer(config, self.layer_idx, main.parallel, main.model.rotary_emb,
                                              main.model.mla_backend)
        self.shared_head_norm = RMSNorm(hidden, eps)
        self._main = (main,)  # a tuple: the main model's modules are not registered as this one's

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, previous_hidden: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        return self.draft(input_ids, positions, previous_hidden, meta)[0]

    def draft(self, input_ids: torch.Tensor, positions: torch.Tensor, previous_hidden: torch.Tensor,
              meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed hidden [T, H] for compute_logits, pre-norm hidden [T, H]): chained drafting feeds
        the pre-norm state back as the next step's previous_hidden, as vLLM's MTP proposer does."""
        embeds = self._main[0].model.embed_tokens(input_ids)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous_hidden)], dim=-1))
        x, residual = self.mtp_block(positions, x, None, meta)
        return self.shared_head_norm(x, residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._main[0].compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load `model.layers.{layer_idx}.*` of a DeepSeek checkpoint; everything else is skipped."""
        prefix = f"model.layers.{self.layer_idx}."

        def mine():
            for name, tensor in weights:
                if not name.startswith(prefix) or name[len(prefix):].startswith(_SHARED_COPIES):
                    continue
                rest = name[len(prefix):]
                if rest.startswith(("enorm.", "hnorm.", "eh_proj.")):
                    yield rest, tensor
                elif rest.startswith("shared_head.norm."):
                    yield "shared_head_norm." + rest.removeprefix("shared_head.norm."), tensor
                else:
                    yield "mtp_block." + rest, tensor

        loaded: set[str] = set()
        dense = route_expert_weights(dict(self.named_parameters()), mine(), loaded)
        return loaded | load_stacked_weights(self, dense, DEEPSEEK_STACKED_PARAMS)
