"""The concurrency sweep: per level, `c` agents each run whole conversations, turns in order.

Each level gets fresh conversations and a fresh salt on the first message, so no level (and no
earlier run against the same server) warms the cache for the next; within a level the system
prompt is shared, as in production. The first `warmup_requests` requests a level starts are
excluded from its figures; after `max_duration_s` no new request starts and the level drains
for at most `drain_timeout_s`, after which requests still in flight are cancelled (and
reported as `cancelled_at_deadline`, not as server errors).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from .client import RequestOptions, RequestRecord, stream_request
from .metrics import summarize_level
from .progress import Progress
from .promstats import cache_delta, scrape
from .workload import Conversation, Message, render_completion_prompt, render_key, salted

_ANCHORS = 8  # earlier conversations' first prompts compared for the shared-prefix estimate


@dataclass(frozen=True)
class SweepConfig:
    """How the sweep runs (see the module docstring)."""

    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    warmup_requests: int | None = None  # per level; None: one per agent (= concurrency)
    max_duration_s: float = 300.0  # per level: no request starts after this
    drain_timeout_s: float | None = None  # then in-flight requests get this long (None: request_timeout_s)
    request_timeout_s: float = 600.0
    num_gpus: int = 1
    cache_page_size: int = 0  # > 0: also report the ideal cached fraction in whole pages
    salt: str = ""  # run tag on the first message; levels append "-c<concurrency>"

    def __post_init__(self):
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError("concurrency levels must be >= 1")
        if self.num_gpus < 1 or self.max_duration_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("num_gpus, max_duration_s and request_timeout_s must be positive")


def common_prefix_len(a: str, b: str) -> int:
    """Length of the common prefix, in time proportional to it (not to the strings).

    Runs on the event loop between requests, so it must not stall other streams' timestamps:
    an extension of a previous prompt is one `startswith`; otherwise gallop then bisect.
    """
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    if long.startswith(short):
        return len(short)
    lo, step, limit = 0, 256, len(short)
    while lo + step <= limit and short[lo:lo + step] == long[lo:lo + step]:
        lo += step
        step *= 2
    hi = min(lo + step, limit)  # the first mismatch lies in [lo, hi)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if short[lo:mid] == long[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Level:
    """State shared by the agents of one level."""

    def __init__(self, concurrency: int, conversations: list[Conversation], cfg: SweepConfig,
                 anchors: list[str]):
        self.concurrency = concurrency
        self.queue = list(reversed(conversations))
        self.warmup = concurrency if cfg.warmup_requests is None else cfg.warmup_requests
        self.deadline = time.perf_counter() + cfg.max_duration_s
        self.salt = f"{cfg.salt}-c{concurrency}" if cfg.salt else ""
        self.started = 0
        self.records: list[RequestRecord] = []
        self.anchors = anchors  # first-turn keys of earlier conversations (whole run)
        self.hit_deadline = False

    def time_left(self) -> bool:
        if time.perf_counter() >= self.deadline:
            self.hit_deadline = True
            return False
        return True


def _ideal_tokens(rec: RequestRecord, key: str, anchor_chars: int, previous: RequestRecord | None,
                  previous_key: str | None) -> int | None:
    """Prompt tokens a perfect, unbounded, token-granular prefix cache could serve.

    Extending the previous turn: exactly its prompt + answer tokens, as the server counted them.
    Otherwise (other conversations' prompts, edited traces) the common prefix in characters,
    converted in proportion to this prompt's characters per token.
    """
    if not rec.prompt_tokens:
        return None
    best = round(rec.prompt_tokens * anchor_chars / len(key))
    if previous is not None and previous_key is not None:
        if key.startswith(previous_key) and previous.prompt_tokens is not None:
            best = max(best, previous.prompt_tokens + (previous.completion_tokens or 0))
        else:
            best = max(best, round(rec.prompt_tokens * common_prefix_len(key, previous_key) / len(key)))
    return min(rec.prompt_tokens, best)


async def _agent(client: httpx.AsyncClient, options: RequestOptions, level: _Level,
                 progress: Progress) -> None:
    while level.queue and level.time_left():
        conv = level.queue.pop()
        history: list[Message] = []
        previous_key: str | None = None
        previous: RequestRecord | None = None
        for index, turn in enumerate(conv.turns):
            if not level.time_left():
                return
            if turn.full_messages is not None:
                messages = salted(turn.full_messages, level.salt)
            else:
                messages = history + (salted(turn.append, level.salt) if not history else turn.append)
            key = render_key(messages)
            anchor_chars = max((common_prefix_len(key, a) for a in level.anchors[-_ANCHORS:]), default=0)
            if index == 0:
                level.anchors.append(key)
            prompt = messages if options.endpoint == "chat" else render_completion_prompt(messages)
            rec = RequestRecord(conv.conv_id, index, level.concurrency, warmup=level.started < level.warmup)
            level.started += 1
            try:
                await stream_request(client, options, prompt, turn.output_tokens, rec)
            except asyncio.CancelledError:
                rec.error, rec.error_detail = "cancelled", "in flight when the level's drain time ran out"
                level.records.append(rec)
                raise
            rec.ideal_cached_tokens = _ideal_tokens(rec, key, anchor_chars, previous, previous_key)
            level.records.append(rec)
            progress.update(rec.ok)
            if not rec.ok:
                break  # without the answer the conversation cannot continue append-only
            history = messages + [{"role": "assistant", "content": rec.answer}]
            previous_key, previous = render_key(history), rec


async def run_sweep(
    client: httpx.AsyncClient, options: RequestOptions,
    make_conversations: Callable[[int, int], list[Conversation]], cfg: SweepConfig,
    progress: Progress,
) -> list[dict[str, Any]]:
    """Run every level; returns per level its summary (with server cache counters) and records."""
    levels = []
    anchors: list[str] = []
    for level_index, concurrency in enumerate(cfg.concurrencies):
        progress.note(f"c={concurrency}: preparing the level's conversations")
        conversations = make_conversations(level_index, concurrency)
        level = _Level(concurrency, conversations, cfg, anchors)
        progress.start_level(f"c={concurrency}", sum(len(c.turns) for c in conversations))
        before = await scrape(client)
        agents = [asyncio.create_task(_agent(client, options, level, progress)) for _ in range(concurrency)]
        drain = cfg.request_timeout_s if cfg.drain_timeout_s is None else cfg.drain_timeout_s
        _, pending = await asyncio.wait(agents, timeout=cfg.max_duration_s + drain)
        for task in pending:
            task.cancel()
        await asyncio.gather(*agents, return_exceptions=True)
        after = await scrape(client)
        progress.close()
        summary = summarize_level(level.records, concurrency, cfg.num_gpus, cfg.cache_page_size)
        summary["duration_limited"] = level.hit_deadline
        summary["conversations"] = len(conversations)
        summary["server_cache"] = cache_delta(before, after, sum(r.prompt_tokens or 0 for r in level.records))
        levels.append({"summary": summary, "records": level.records})
    return levels
