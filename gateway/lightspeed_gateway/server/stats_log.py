"""The periodic engine stats line (as vLLM's), and a progress line for prefills that take long.

Every `interval_s` while the engine is busy (and once more when it goes idle):

    Engine: prompt 812.4 tok/s, generation 9.1 tok/s, running 1, waiting 0, KV cache 12.5% used
    (340 cached pages), prefix cache hit rate 45.0%

Rates are differences of the engine's cumulative counters over the interval: prompt tokens the
engine computed (prefix-cache hits excluded), tokens it sampled. A request still waiting for its
first token after an interval gets its own line, so a 40 s CPU prefill is visibly alive.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("lightspeed.gateway")


class StatsLogger:
    def __init__(self, engine: Any) -> None:
        self.engine = engine  # EngineClient: stats() and the requests awaiting their first token
        self._last: dict[str, Any] | None = None
        self._last_time = 0.0
        self._was_busy = False

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            for line in self.lines(time.monotonic(), interval_s):
                log.info("%s", line)

    def lines(self, now: float, interval_s: float) -> list[str]:
        """What to log now (nothing while idle, apart from the first idle interval after work)."""
        stats = self.engine.stats() or {}
        last, last_time = self._last, self._last_time
        self._last, self._last_time = stats, now
        if "num_running" not in stats or last is None:
            return []  # the first snapshot only sets the baseline
        elapsed = max(now - last_time, 1e-9)
        prompt_rate = _delta(stats, last, "num_prefill_tokens") / elapsed
        generation_rate = _delta(stats, last, "num_generated_tokens") / elapsed
        busy = bool(stats.get("num_running") or stats.get("num_waiting") or prompt_rate or generation_rate)
        if not busy and not self._was_busy:
            return []
        self._was_busy = busy
        lines = [self.stats_line(stats, last, prompt_rate, generation_rate)]
        for request_id, waited_s, prompt_tokens in self.engine.awaiting_first_token(now):
            if waited_s >= interval_s:  # queued or prefilling: either way, still alive
                lines.append(f"request {request_id}: {prompt_tokens} prompt tokens, no output yet after "
                             f"{waited_s:.0f} s (queued or prefilling; the engine computes {prompt_rate:.0f} "
                             "prompt tok/s)")
        return lines

    @staticmethod
    def stats_line(stats: dict[str, Any], last: dict[str, Any], prompt_rate: float, generation_rate: float) -> str:
        queried = _delta(stats, last, "prefix_query_tokens")
        hit_rate = f"{100 * _delta(stats, last, 'prefix_hit_tokens') / queried:.1f}%" if queried else "-"
        cached = stats.get("cached_device_pages")
        cached_text = f" ({cached} cached pages)" if cached is not None else ""
        return (f"Engine: prompt {prompt_rate:.1f} tok/s, generation {generation_rate:.1f} tok/s, "
                f"running {stats.get('num_running', 0)}, waiting {stats.get('num_waiting', 0)}, "
                f"KV cache {100 * float(stats.get('kv_usage') or 0):.1f}% used{cached_text}, "
                f"prefix cache hit rate {hit_rate}")


def _delta(now: dict[str, Any], before: dict[str, Any], key: str) -> float:
    return max(0.0, float(now.get(key) or 0) - float(before.get(key) or 0))
