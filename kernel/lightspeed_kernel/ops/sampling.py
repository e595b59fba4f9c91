"""Sampling ops (family ``sampling``). Dispatch dtype: ``logits.dtype`` (fp32). Per-row
parameters are tensors, so a batch mixes greedy and sampled rows without host sync."""

from __future__ import annotations

import torch

from ._dispatch import impl_for


def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Presence / frequency / repetition penalties (sampling/penalties), OpenAI + vLLM semantics.

    logits: [S, V] fp32; output_counts: [S, V] int32 (times generated); prompt_mask: [S, V] bool;
    presence, frequency, repetition: [S] fp32 (0, 0, 1 = off). Returns logits (may be in place).
    """
    return impl_for("sampling", "penalties", logits)(
        logits, output_counts, prompt_mask, presence, frequency, repetition
    )


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """Draw one token per row (sampling/sample).

    logits: [S, V] fp32; temperature [S] (<= 0: greedy); top_k [S] int32 (<= 0: off); top_p [S]
    (1: off); min_p [S] (0: off); seeds, offsets [S] int64. The randomness is a hash of
    (seed, offset, token) (see ``lightspeed_kernel.reference.rng``): the same seed and offset give
    the same token on every device. Returns [S] int64.
    """
    return impl_for("sampling", "sample", logits)(logits, temperature, top_k, top_p, min_p, seeds, offsets)


def greedy(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's first index of its largest logit (sampling/greedy): ``logits.argmax(dim=-1)``,
    NaN counting as the largest and -0.0 equal to 0.0, as torch has it.

    logits: [S, V] fp32, bf16 or fp16. Returns [S] int64: ``out`` (contiguous int64 [S]) when given,
    written in place (a CUDA graph's static buffer).
    """
    return impl_for("sampling", "greedy", logits)(logits, out)


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top_n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-softmax of each row at ``token_ids`` and its ``top_n`` best entries (sampling/logprobs).

    logits: [S, V]; token_ids: [S]. Returns (token_logprob [S] fp32, top_ids [S, top_n] int64,
    top_logprobs [S, top_n] fp32, descending).
    """
    return impl_for("sampling", "logprobs", logits)(logits, token_ids, top_n)
