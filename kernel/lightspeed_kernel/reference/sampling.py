"""Sampling references: penalties, seeded sampling (greedy / temperature / top-k / top-p / min-p),
log-probabilities. Every parameter is per row; nothing synchronises with the host.

Sampling order: logits / temperature -> min-p (prob >= min_p * max prob) -> top-k -> top-p on
what is left (renormalised; the smallest prefix whose mass reaches top_p). Each filter keeps a
prefix of the descending order, so the result is one threshold per row: every token whose scaled
logit is >= the last kept value survives (ties at the cut are kept). The token is then the
Gumbel-max argmax of scaled logit - log(-log(u)) over survivors, u from :mod:`.rng`.
"""

from __future__ import annotations

import torch

from ._register import reference
from .rng import uniform


@reference("sampling", "penalties")
def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    # logits: [S, V] fp32 (updated in place and returned); output_counts: [S, V] int32 (times each
    # token was generated); prompt_mask: [S, V] bool; presence, frequency, repetition: [S] fp32.
    # repetition (1 = off) divides positive / multiplies negative logits of tokens seen in prompt
    # or output; frequency subtracts frequency * count; presence subtracts presence once if generated.
    counts = output_counts.to(logits.dtype)
    generated = output_counts > 0
    rep = repetition.to(logits.dtype)[:, None]
    seen = prompt_mask | generated
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    result = torch.where(seen, penalised, logits)
    result = (
        result - frequency.to(logits.dtype)[:, None] * counts - presence.to(logits.dtype)[:, None] * generated
    )
    return logits.copy_(result)


def keep_threshold(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """[S, V] temperature-scaled logits -> [S, 1] the smallest scaled logit that survives."""
    num_rows, vocab = scaled.shape
    sorted_vals = scaled.sort(dim=-1, descending=True).values
    keep = torch.ones_like(sorted_vals, dtype=torch.bool)
    # min-p: p_i / p_max = exp(s_i - s_max)
    keep &= torch.exp(sorted_vals - sorted_vals[:, :1]) >= min_p.float()[:, None]
    # top-k by value: every token tied with the k-th largest stays, whatever order sort() gave them
    k = top_k.long()[:, None]
    kth_value = sorted_vals.gather(1, (k - 1).clamp(0, vocab - 1))
    keep &= (k <= 0) | (sorted_vals >= kth_value)
    keep[:, 0] = True
    probs = torch.softmax(sorted_vals.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    keep &= mass_before < top_p.float()[:, None]
    keep[:, 0] = True
    last_kept = keep.sum(dim=-1, keepdim=True) - 1  # keep is a prefix of the sorted order
    return sorted_vals.gather(1, last_kept)


@reference("sampling", "sample")
def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    # logits: [S, V] fp32; temperature, top_p, min_p: [S] fp32; top_k: [S] int32;
    # seeds, offsets: [S] int64 -> token ids [S] int64. temperature <= 0 = greedy (first argmax).
    num_rows, vocab = logits.shape
    if num_rows == 0:
        return torch.empty(0, dtype=torch.int64, device=logits.device)
    logits = logits.float()
    greedy = temperature <= 0
    safe_temperature = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / safe_temperature[:, None]
    threshold = keep_threshold(scaled, top_k, top_p, min_p)
    gumbel = -torch.log(-torch.log(uniform(seeds, offsets, vocab).to(logits.device)))
    race = torch.where(scaled >= threshold, scaled + gumbel, torch.full_like(scaled, float("-inf")))
    sampled = race.argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


@reference("sampling", "greedy")
def greedy(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    # logits: [S, V] -> [S] int64 (into `out` when given), the first index of each row's maximum (NaN the largest)
    return logits.argmax(dim=-1) if out is None else torch.argmax(logits, dim=-1, out=out)


@reference("sampling", "logprobs")
def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top_n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # logits: [S, V]; token_ids: [S] -> (token_logprob [S] fp32, top_ids [S, top_n] int64,
    # top_logprobs [S, top_n] fp32), top entries in descending order
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    token_logprob = logprobs.gather(1, token_ids.long()[:, None]).squeeze(1)
    top_logprobs, top_ids = logprobs.topk(top_n, dim=-1)
    return token_logprob, top_ids, top_logprobs
