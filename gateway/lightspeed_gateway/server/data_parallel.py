"""Data-parallel engine cores behind one cache-aware router.

Design note. Each data-parallel engine core has its own scheduler and prefix cache, so where a
request runs decides whether its prompt is computed again: an agent's turn k+1 extends turn k, and
only the core that served turn k holds it. The router keeps an approximate copy of every core's
prefix cache (`PrefixIndex`: chained hashes of the full pages of the sequences it sent there,
least recently used dropped beyond the core's page count) and sends a request to the core with the
longest cached prefix of its prompt, unless that core is overloaded against the least loaded one
(then, and for prompts no core holds, the least loaded core takes it). A conversation id
(`session_id`, from `prompt_cache_key` or Anthropic's `metadata.user_id`) sticks a conversation to
its core even before its prefix reaches a full page. The copy is approximate (an engine may have
evicted a page it lists), so a wrong guess costs a recomputed prefix, never a wrong answer.

Faults. Cores in separate worlds (a dense model, or MoE without expert parallelism across the
cores) step alone, so one's death costs only its own requests: they fail (`CoreDead`), the router
stops sending there, the others keep serving, and the supervisor restarts that core alone
(`restart_core`; the router forgets its cache). Cores that step together share one world and only
meet again at a fresh rendezvous: when one dies the gateway fails every request in flight and the
supervisor restarts them all (`restart`). Either way the router's copy of a restarted core's cache
starts empty again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
from lightspeed import EngineDeadError

from lightspeed_gateway.server.engine import CoreDead, EngineDead

log = logging.getLogger("lightspeed.gateway")

_MASK = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15


class PrefixIndex:
    """Which full pages of which sequences each core probably caches, as chained page hashes."""

    def __init__(self, num_ranks: int, page_size: int, capacity_pages: int):
        self.page_size, self.capacity = page_size, max(1, capacity_pages)
        self._pages: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(num_ranks)]
        rng = np.random.default_rng(0)
        self._weights = rng.integers(1, 2**63 - 1, size=page_size, dtype=np.uint64) | np.uint64(1)

    def keys(self, tokens: Sequence[int]) -> list[int]:
        """One key per full page: the page's tokens chained with every page before it."""
        full = len(tokens) // self.page_size * self.page_size
        if not full:
            return []
        pages = np.asarray(tokens[:full], dtype=np.uint64).reshape(-1, self.page_size)
        with np.errstate(over="ignore"):  # wrapping arithmetic is the hash
            page_hashes = ((pages + np.uint64(1)) * self._weights).sum(axis=1).tolist()
        keys, key = [], 0
        for h in page_hashes:
            key = ((key ^ h) * _MIX + 1) & _MASK
            keys.append(key)
        return keys

    def matched_pages(self, keys: list[int]) -> list[int]:
        """Per core: how many leading pages of the sequence it holds."""
        matched = []
        for pages in self._pages:
            n = 0
            while n < len(keys) and keys[n] in pages:
                n += 1
            matched.append(n)
        return matched

    def forget(self, rank: int) -> None:
        """A core restarted: its cache is empty."""
        self._pages[rank].clear()

    def insert(self, rank: int, keys: list[int]) -> None:
        pages = self._pages[rank]
        for key in keys:
            pages[key] = None
            pages.move_to_end(key)
        while len(pages) > self.capacity:
            pages.popitem(last=False)


class CacheAwareRouter:
    """Longest cached prefix first, sticky conversations, least loaded otherwise.

    A core is overloaded when it runs more than `balance_abs` requests beyond the least loaded one
    and more than `balance_rel` times as many (SGLang's router has the same two thresholds)."""

    MAX_SESSIONS = 100_000

    def __init__(self, num_ranks: int, page_size: int, capacity_pages: int, *, balance_abs: int = 16,
                 balance_rel: float = 1.5):
        self.index = PrefixIndex(num_ranks, page_size, capacity_pages)
        self.num_ranks, self.balance_abs, self.balance_rel = num_ranks, balance_abs, balance_rel
        self._sessions: OrderedDict[str, int] = OrderedDict()
        self._turn = 0

    def _overloaded(self, rank: int, loads: list[int], ranks: list[int]) -> bool:
        least = min(loads[r] for r in ranks)
        return loads[rank] > least + self.balance_abs and loads[rank] > self.balance_rel * least

    def _least_loaded(self, loads: list[int], ranks: list[int]) -> int:
        least = min(loads[r] for r in ranks)
        self._turn += 1  # ties rotate, so idle cores share new conversations
        tied = [r for r in ranks if loads[r] == least]
        return tied[self._turn % len(tied)]

    def route(self, keys: list[int], loads: list[int], session_id: str | None = None,
              live: Sequence[int] | None = None) -> int:
        """The core for a prompt with page keys `keys`, given every core's requests in flight; only
        cores in `live` (all when None) are candidates: a dead or restarting one gets nothing."""
        ranks = list(range(self.num_ranks)) if live is None else list(live)
        rank = self._sessions.get(session_id) if session_id is not None else None
        if rank is None or rank not in ranks or self._overloaded(rank, loads, ranks):
            matched = self.index.matched_pages(keys)
            best = max(ranks, key=lambda r: (matched[r], -loads[r]))
            rank = best if matched[best] and not self._overloaded(best, loads, ranks) else \
                self._least_loaded(loads, ranks)
        if session_id is not None:
            self._sessions[session_id] = rank
            self._sessions.move_to_end(session_id)
            if len(self._sessions) > self.MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return rank


class DataParallelEngine:
    """`AsyncLLM`'s interface (what the gateway's EngineClient uses) over data-parallel engine cores."""

    def __init__(self, cores: list[Any]):
        if not cores:
            raise ValueError("no engine cores")
        self.cores = cores
        info = self.engine_info = cores[0].engine_info
        self.config = cores[0].config
        self.router = CacheAwareRouter(len(cores), info.page_size, info.num_device_pages + info.num_host_pages)
        self._inflight = [0] * len(cores)
        self._routed = [0] * len(cores)
        self._owner: dict[str, int] = {}
        # Cores in one world (expert parallelism across them) die and restart together; others alone.
        self.steps_together = bool(getattr(info, "steps_with_others", False))
        self._down: set[int] = set()  # cores seen dead, or restarting: the router skips them

    @classmethod
    def start(cls, config) -> DataParallelEngine:
        """Start the cores of `config` (an EngineConfig with data_parallel_size > 1) at once."""
        from lightspeed import AsyncLLM, data_parallel_configs

        return cls(AsyncLLM.start_many(data_parallel_configs(config)))

    # -- AsyncLLM's surface ------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int:
        return self.engine_info.max_model_len

    @property
    def engine_pid(self) -> int:
        return self.cores[0].engine_pid

    @property
    def engine_pids(self) -> list[int]:
        return [core.engine_pid for core in self.cores]

    @property
    def errored(self) -> bool:
        """Down as a whole: any core of cores that step together; every core of independent ones."""
        if self.steps_together:
            return any(core.errored for core in self.cores)
        return not self.live_cores

    @property
    def is_running(self) -> bool:
        return not self.errored

    # -- cores that fail alone (the supervisor's view) ---------------------------------------------
    @property
    def independent_cores(self) -> int:
        """How many cores the supervisor watches and restarts one by one (0: they step together)."""
        return 0 if self.steps_together else len(self.cores)

    @property
    def live_cores(self) -> list[int]:
        return [d for d in range(len(self.cores)) if not self.core_errored(d)]

    def core_errored(self, rank: int) -> bool:
        return rank in self._down or self.cores[rank].errored

    async def restart_core(self, rank: int) -> None:
        """Start core `rank` again (the others serve on); raises if it cannot start (it stays out)."""
        self._down.add(rank)
        await self.cores[rank].restart()
        self.router.index.forget(rank)
        self.engine_info = self.cores[0].engine_info
        self._down.discard(rank)

    def get_tokenizer(self) -> Any:
        return self.cores[0].get_tokenizer()

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> list[int]:
        return self.cores[0].apply_chat_template(messages, **kwargs)

    async def generate(self, prompt, sampling_params=None, request_id: str | None = None, *, priority: int = 0,
                       session_id: str | None = None) -> AsyncIterator[Any]:
        """Stream a request's outputs from the core the router picks for it."""
        tokens = self._token_ids(prompt)
        keys = self.router.index.keys(tokens)
        live = self.live_cores
        if not live:
            raise EngineDead("no data-parallel engine core is serving")
        rank = self.router.route(keys, self._inflight, session_id, live)
        # The prompt is in that core's cache from its first chunk on: later requests sharing it follow.
        self.router.index.insert(rank, keys)
        kwargs: dict[str, Any] = {"priority": priority}
        if session_id is not None:
            kwargs["session_id"] = session_id
        self._inflight[rank] += 1
        self._routed[rank] += 1
        if request_id is not None:
            self._owner[request_id] = rank
        output: list[int] = []
        delta = sampling_params is not None and getattr(sampling_params.output_kind, "name", "") == "DELTA"
        try:
            async for out in self.cores[rank].generate(prompt, sampling_params, request_id, **kwargs):
                if out.outputs:
                    ids = list(out.outputs[0].token_ids)
                    output = output + ids if delta else ids
                yield out
        except EngineDeadError as e:
            if self.steps_together:
                raise
            self._down.add(rank)  # no new request goes there until the supervisor has restarted it
            raise CoreDead(f"data-parallel engine core {rank} stopped: {e}") from None
        finally:
            self._inflight[rank] -= 1
            if request_id is not None:
                self._owner.pop(request_id, None)
            self.router.index.insert(rank, self.router.index.keys(tokens + output))

    def _token_ids(self, prompt) -> list[int]:
        if isinstance(prompt, dict):
            prompt = prompt.get("prompt_token_ids", prompt.get("prompt"))
        if isinstance(prompt, str):
            return list(self.get_tokenizer()(prompt).input_ids)
        return [int(t) for t in prompt]

    async def abort(self, request_id: str | Sequence[str]) -> None:
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            rank = self._owner.get(rid)
            if rank is not None:
                await self.cores[rank].abort(rid)

    def stats(self) -> dict[str, Any]:
        """Every core's snapshot (`ranks`, each with its `dp_rank` and requests routed to it) and their
        sums for the counts that add up."""
        ranks = []
        for d, core in enumerate(self.cores):
            snap = dict(core.stats())
            snap.update(dp_rank=d, num_routed_requests=self._routed[d], num_inflight_requests=self._inflight[d])
            ranks.append(snap)
        total: dict[str, Any] = {"ranks": ranks, "engine_alive": self.is_running, "max_model_len": self.max_model_len}
        for key in ("num_running", "num_waiting", "num_retracted", "num_client_requests", "prefix_hit_tokens",
                    "prefix_query_tokens", "num_steps", "num_generated_tokens", "free_device_pages"):
            values = [r[key] for r in ranks if r.get(key) is not None]
            if values:
                total[key] = sum(values)
        return total

    async def restart(self) -> None:
        """Start every core again, at once (AsyncLLM.restart each: same config and tokenizer): what
        cores that step together need. Raises if one cannot start (the supervisor then tries again,
        all of them). Every old core is stopped before any new one starts (AsyncLLM.stop_core says why)."""
        await asyncio.gather(*(core.stop_core() for core in self.cores), return_exceptions=True)
        results = await asyncio.gather(*(core.restart() for core in self.cores), return_exceptions=True)
        info = self.engine_info = self.cores[0].engine_info
        self.router = CacheAwareRouter(len(self.cores), info.page_size, info.num_device_pages + info.num_host_pages)
        errors = [r for r in results if isinstance(r, BaseException)]
        self._down = {d for d, r in enumerate(results) if isinstance(r, BaseException)}
        if errors:
            raise errors[0]

    def shutdown(self) -> None:
        for core in self.cores:
            core.shutdown()
