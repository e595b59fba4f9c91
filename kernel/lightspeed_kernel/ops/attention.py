"""Paged attention ops (family ``attention``). Dispatch dtype: ``q.dtype``; features requested:
``fp8_kv`` when the cache is fp8, ``soft_cap`` when a soft-cap is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ._dispatch import FP8_DTYPES, FP8_KV, SOFT_CAP, impl_for


def _features(k_cache: torch.Tensor, soft_cap: float | None) -> tuple[str, ...]:
    fp8 = k_cache.dtype in FP8_DTYPES
    if soft_cap is None:
        return (FP8_KV,) if fp8 else ()
    return (FP8_KV, SOFT_CAP) if fp8 else (SOFT_CAP,)


class HostLengths(NamedTuple):
    """``query_start_loc`` and ``seq_lens`` of a call as host integers, equal to the device tensors.

    The engine's scheduler plans every step on the host, so it has them for free. A kernel that
    plans on the host (FlashInfer's ``plan()``, a loop over requests) reads these instead of
    copying the device tensors back: that copy waits for every step still queued ahead on the
    stream, which undoes the engine's overlap of step N+1's launch with step N's run.
    """

    query_start_loc: Sequence[int]  # [B+1], e.g. a numpy int array
    seq_lens: Sequence[int]  # [B]

    def as_lists(self) -> tuple[list[int], list[int]]:
        return [int(x) for x in self.query_start_loc], [int(x) for x in self.seq_lens]


def attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    scale: float,
    soft_cap: float | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    out: torch.Tensor | None = None,
    host_lengths: HostLengths | None = None,
) -> torch.Tensor:
    """Causal attention of new tokens over their request's cached prefix and themselves.

    q: [T, Hq, D] (Hq a multiple of Hkv); k_cache, v_cache: [num_pages, page_size, Hkv, D], the
    new tokens' K/V already stored; page_table: [B, P] int32; query_start_loc: [B+1] int32;
    seq_lens: [B] int32 (new tokens included). A request's q_len new tokens are its last ones:
    the mask is bottom-right aligned. ``scale`` multiplies q·k; ``soft_cap`` c maps scores to
    c·tanh(s/c); fp8 caches are dequantised with ``k_scale`` / ``v_scale``. ``host_lengths``, when
    given, holds the same lengths on the host (:class:`HostLengths`). Returns [T, Hq, D].
    """
    return impl_for("attention", "prefill", q, _features(k_cache, soft_cap))(
        q, k_cache, v_cache, page_table, query_start_loc, seq_lens,
        max_query_len=max_query_len, scale=scale, soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale, out=out,
        host_lengths=host_lengths,
    )  # fmt: skip


def attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    scale: float,
    soft_cap: float | None = None,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
    out: torch.Tensor | None = None,
    host_lengths: HostLengths | None = None,
) -> torch.Tensor:
    """:func:`attention_prefill` for 1..16 query tokens per request (decode, speculative
    verification), causal among them. ``max_query_len`` bounds the query tokens of any request."""
    return impl_for("attention", "decode", q, _features(k_cache, soft_cap))(
        q, k_cache, v_cache, page_table, query_start_loc, seq_lens,
        max_query_len=max_query_len, scale=scale, soft_cap=soft_cap, k_scale=k_scale, v_scale=v_scale, out=out,
        host_lengths=host_lengths,
    )  # fmt: skip
