"""Drive `lightspeed.core.engine.Engine` in-process, as the engine core's loop does (no sockets)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from lightspeed.config import EngineConfig
from lightspeed.core import messages as m
from lightspeed.core.engine import Engine


def make_engine(model: str, **overrides) -> Engine:
    torch.set_num_threads(1)
    settings = {"load_format": "dummy", "kv_cache_memory": "8MiB", "host_cache_memory": "1MiB", "max_num_seqs": 8,
                "max_model_len": 256, **overrides}
    return Engine(EngineConfig(model=model, **settings))


@dataclass
class Run:
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    cached_by_tier: dict[str, list[int]] = field(default_factory=dict)  # [device, host, disk]
    errors: dict[str, str] = field(default_factory=dict)    # failed while running (finished "error")
    rejected: dict[str, str] = field(default_factory=dict)  # rejected after admission (e.g. their grammar)
    logprobs: dict[str, list] = field(default_factory=dict)  # request -> TokenLogprobs per token (if asked)
    steps: int = 0
    overlapped_steps: int = 0  # steps that left a launched step in flight (async scheduling)


def submit(engine: Engine, name: str, prompt: list[int], spec: m.SamplingSpec) -> None:
    error = engine.add_request(m.AddRequest(name, list(prompt), spec))
    assert error is None, error


def run_until_idle(engine: Engine, run: Run | None = None, *, on_step=None, max_steps: int = 5000) -> Run:
    """Step until no request is left and every KV copy has landed (the core's idle flush).
    `on_step(engine, run)` runs after every step (aborts mid-flight, counters)."""
    run = run or Run()
    while engine.has_work() or engine.has_pending_copies() or engine.has_pending_grammars():
        assert run.steps < max_steps, "the engine never went idle"
        engine.admit_compiled()
        if not (engine.has_work() or engine.has_pending_copies()):
            time.sleep(0.001)  # only grammars compiling (the core's loop polls its socket meanwhile)
            _take_errors(engine, run)
            continue
        out = engine.step()
        run.steps += 1
        run.overlapped_steps += engine._in_flight is not None
        for name, token in zip(out.request_ids, out.token_ids, strict=True):
            run.tokens.setdefault(name, []).append(token)
        run.finished.update(out.finished or {})
        run.cached.update(out.num_cached_tokens or {})
        run.cached_by_tier.update(out.cached_tokens_by_tier or {})
        for name, lp in (out.logprobs or {}).items():
            run.logprobs.setdefault(name, []).extend(lp)  # one entry per token of the step
        _take_errors(engine, run)
        if on_step is not None:
            on_step(engine, run)
    _take_errors(engine, run)
    return run


def _take_errors(engine: Engine, run: Run) -> None:
    errors = engine.take_errors()
    if errors is not None:
        run.rejected.update(errors.errors)
        run.errors.update(errors.failed)
        run.finished.update({name: "error" for name in errors.failed})
