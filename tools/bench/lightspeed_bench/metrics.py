"""Per-level figures from client-side request records.

Definitions (all from client timestamps; warm-up requests excluded, failed requests excluded
from latency and token figures but counted in `errors`, except requests cancelled when a level's
drain time ran out, counted in `cancelled_at_deadline`):
- TTFT: first text chunk - request sent. `ttft_ms_first_turn` / `ttft_ms_later_turns`: the same over
  a conversation's first request (its long prompt, mostly prefill) and over the rest (a short turn
  after a cached prefix): where an agentic gap is, prefill speed or the prefix cache.
- TPOT: (last text chunk - first text chunk) / (completion_tokens - 1), per request.
- ITL: gaps between consecutive text chunks.
- tokens/s/user: 1000 / mean TPOT (ms). The p10 user: each conversation's 1000 / mean TPOT of
  its requests, 10th percentile over conversations (the slow tail a floor must cover).
- Throughput window: earliest measured request start -> latest measured request end.
  tokens/min/GPU = tokens in the window * 60 / window seconds / num_gpus.
- cached fraction: sum(cached_tokens) / sum(prompt_tokens) over requests that reported it.
  `cached_fraction_incl_warmup` is the same over warm-up requests too, comparable with the
  server's /metrics counters, which cannot tell warm-up apart.
- ideal cached fraction: sum(ideal_cached_tokens) / sum(prompt_tokens), what a perfect prefix
  cache (token granularity, unbounded memory) would have served; with a page size, the same
  rounded down to whole pages per request (what a paged cache such as Lightspeed's can serve).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from .client import RequestRecord

PERCENTILES = (50, 90, 99)


def _dist_ms(values: Iterable[float]) -> dict[str, float | None]:
    arr = np.asarray([v * 1000.0 for v in values], dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    out = {"mean": float(arr.mean())}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def _ratio(num: float, den: float) -> float | None:
    return None if den <= 0 else num / den


def summarize_level(records: list[RequestRecord], concurrency: int, num_gpus: int,
                    page_size: int = 0) -> dict[str, Any]:
    """One concurrency level's figures; see the module docstring for each definition."""
    measured = [r for r in records if not r.warmup and r.ok]
    errors = Counter(r.error for r in records if not r.ok and r.error != "cancelled")
    tpots = [r.tpot for r in measured if r.tpot is not None]
    ttfts = [r.ttft for r in measured if r.ttft is not None]
    first_turn_ttfts = [r.ttft for r in measured if r.ttft is not None and r.turn == 0]
    later_turn_ttfts = [r.ttft for r in measured if r.ttft is not None and r.turn > 0]
    itls = [gap for r in measured for gap in r.itls]

    tpot = _dist_ms(tpots)
    per_user: dict[str, list[float]] = defaultdict(list)
    for r in measured:
        if r.tpot is not None:
            per_user[r.conv_id].append(r.tpot)
    user_tps = [1.0 / float(np.mean(v)) for v in per_user.values()]

    out_tokens = sum(r.completion_tokens or 0 for r in measured)
    in_tokens = sum(r.prompt_tokens or 0 for r in measured)
    if measured:
        window = max(r.end for r in measured) - min(r.start for r in measured)
    else:
        window = 0.0
    per_min_gpu = 60.0 / window / num_gpus if window > 0 else 0.0

    reported = [r for r in measured if r.cached_tokens is not None and r.prompt_tokens]
    reported_all = [r for r in records if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    ideal = [r for r in measured if r.ideal_cached_tokens is not None and r.prompt_tokens]
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "requests_warmup": sum(r.warmup for r in records),
        "requests_measured": len(measured),
        "errors": dict(errors),
        "error_count": sum(errors.values()),
        "error_examples": _error_examples(records),
        "cancelled_at_deadline": sum(r.error == "cancelled" for r in records),
        "window_s": window,
        "ttft_ms": _dist_ms(ttfts),
        "ttft_ms_first_turn": _dist_ms(first_turn_ttfts),
        "ttft_ms_later_turns": _dist_ms(later_turn_ttfts),
        "tpot_ms": tpot,
        "itl_ms": _dist_ms(itls),
        "tokens_per_s_per_user": None if not tpot["mean"] else 1000.0 / tpot["mean"],
        "tokens_per_s_per_user_p10": float(np.percentile(user_tps, 10)) if user_tps else None,
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "output_tokens_per_min_per_gpu": out_tokens * per_min_gpu,
        "total_tokens_per_min_per_gpu": (in_tokens + out_tokens) * per_min_gpu,
        "request_throughput_per_s": _ratio(len(measured), window),
        "cached_tokens": sum(r.cached_tokens for r in reported),
        "cached_fraction": _ratio(sum(r.cached_tokens for r in reported),
                                  sum(r.prompt_tokens for r in reported)),
        "cached_reported_requests": len(reported),
        "cached_fraction_incl_warmup": _ratio(sum(r.cached_tokens for r in reported_all),
                                              sum(r.prompt_tokens for r in reported_all)),
        "ideal_cached_fraction": _ratio(sum(r.ideal_cached_tokens for r in ideal),
                                        sum(r.prompt_tokens for r in ideal)),
        "ideal_cached_fraction_paged": None if page_size <= 0 else _ratio(
            sum(r.ideal_cached_tokens // page_size * page_size for r in ideal), sum(r.prompt_tokens for r in ideal)),
        "cache_page_size": page_size or None,
    }


def _error_examples(records: list[RequestRecord]) -> dict[str, str]:
    """Per kind of failure, the first one's detail: the server's own message where it sent one."""
    examples: dict[str, str] = {}
    for r in records:
        if not r.ok and r.error != "cancelled" and r.error not in examples:
            examples[r.error] = _server_message(r.error_detail)
    return examples


def _server_message(detail: str) -> str:
    try:
        body = json.loads(detail)
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("message", detail)
    except (ValueError, KeyError, TypeError, AttributeError):
        message = detail
    return " ".join(str(message).split())[:200]


def best_at_floor(levels: list[dict[str, Any]], floor: float) -> dict[str, Any] | None:
    """The level with the most output tokens/min/GPU whose p10 user still gets `floor` tokens/s."""
    ok = [lvl for lvl in levels if (lvl.get("tokens_per_s_per_user_p10") or 0) >= floor]
    if not ok:
        return None
    best = max(ok, key=lambda lvl: lvl["output_tokens_per_min_per_gpu"])
    return {"floor_tokens_per_s_per_user": floor, "concurrency": best["concurrency"],
            "output_tokens_per_min_per_gpu": best["output_tokens_per_min_per_gpu"],
            "tokens_per_s_per_user_p10": best["tokens_per_s_per_user_p10"]}
