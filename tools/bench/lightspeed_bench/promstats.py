"""Prefix-cache and speculative-decoding counters from a Prometheus /metrics page, diffed around a level.

Engines name these differently (lightspeed:prefix_cache_hit_tokens_total,
vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, ...). Any counter whose name
mentions the prefix cache is kept; hits and queries are recognised by name. Speculative decoding:
`*spec_decode_num_drafts*`, `*_num_draft_tokens*`, `*_num_accepted_tokens*` (Lightspeed's and
vLLM's names), giving the mean tokens a drafting row keeps per step (accepted drafts + 1).
"""

from __future__ import annotations

import re
from typing import Any

import httpx

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)")
_PROMPT_COUNTER = re.compile(r"prompt_tokens(_total)?$")


def parse_counters(text: str) -> dict[str, float]:
    """Sum of each relevant series over its labels: prefix-cache series and prompt-token counters."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name = match.group(1)
        if name.endswith(("_bucket", "_created", "_sum", "_count")):
            continue
        if "prefix_cache" in name or "spec_decode" in name or _PROMPT_COUNTER.search(name):
            totals[name] = totals.get(name, 0.0) + float(match.group(3))
    return totals


async def scrape(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The counters now, or None when the server has no usable /metrics."""
    try:
        resp = await client.get("/metrics", timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return parse_counters(resp.text)


def cache_delta(before: dict[str, float] | None, after: dict[str, float] | None,
                client_prompt_tokens: int) -> dict[str, Any] | None:
    """Counter deltas and the server-side cached fraction (hits / queries, else hits / prompt tokens)."""
    if before is None or after is None:
        return None
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    hits = [v for k, v in delta.items() if "prefix_cache" in k and "hit" in k and "rate" not in k]
    queries = [v for k, v in delta.items() if "prefix_cache" in k and ("quer" in k or "lookup" in k)]
    prompts = [v for k, v in delta.items() if "prefix_cache" not in k and _PROMPT_COUNTER.search(k)]
    fraction = None
    if hits:
        den = queries[0] if queries else prompts[0] if prompts else float(client_prompt_tokens)
        fraction = hits[0] / den if den > 0 else None
    return {"counters": delta, "cached_fraction": fraction, **_speculative(delta)}


def _speculative(delta: dict[str, float]) -> dict[str, float]:
    def one(part: str) -> float | None:
        values = [v for k, v in delta.items() if "spec_decode" in k and k.removesuffix("_total").endswith(part)]
        return values[0] if values else None

    drafts, draft_tokens, accepted = one("num_drafts"), one("num_draft_tokens"), one("num_accepted_tokens")
    if not drafts or accepted is None:
        return {}
    return {"spec_acceptance_length": (accepted + drafts) / drafts,
            "spec_draft_acceptance_rate": accepted / draft_tokens if draft_tokens else None}
