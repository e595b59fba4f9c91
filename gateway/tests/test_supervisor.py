"""EngineSupervisor's policy on a stand-in engine: immediate first restart, exponential back-off, bounded
attempts, then "dead" for good (the real restart is in test_serve_faults.py)."""

import asyncio
import time

from lightspeed_gateway.server import supervisor as sup
from lightspeed_gateway.server.engine import EngineClient


class StubEngine:
    """The part of EngineClient the supervisor uses; `restart` fails `failures` times."""

    def __init__(self, failures: int):
        self.alive, self.failures = False, failures
        self.attempts: list[float] = []
        self.given_up = False
        self.dead_reason = "killed"

    status = EngineClient.status
    dead = EngineClient.dead
    can_restart = True
    num_cores = 0  # one engine, no data-parallel cores that fail alone

    def check_alive(self) -> bool:
        return self.alive

    async def restart(self) -> None:
        self.attempts.append(time.monotonic())
        if len(self.attempts) <= self.failures:
            raise RuntimeError("the model did not load")
        self.alive, self.dead_reason = True, None


def _run(engine, max_restarts, backoff_s, run_for_s):
    supervisor = sup.EngineSupervisor(engine, 0.01, max_restarts, backoff_s)

    async def main():
        task = asyncio.ensure_future(supervisor.run())
        await asyncio.sleep(run_for_s)
        done = task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return done

    return supervisor, asyncio.run(main())


def test_restarts_with_backoff_until_it_comes_back():
    engine = StubEngine(failures=2)
    assert engine.status == "restarting"
    supervisor, gave_up = _run(engine, max_restarts=5, backoff_s=0.1, run_for_s=0.6)
    assert not gave_up and engine.status == "ok" and supervisor.num_restarts == 1
    gaps = [b - a for a, b in zip(engine.attempts, engine.attempts[1:], strict=False)]
    assert len(engine.attempts) == 3 and 0.09 <= gaps[0] < 0.19 and 0.19 <= gaps[1] < 0.35  # 0.1 s, then 0.2 s


def test_gives_up_after_max_restarts_in_a_row():
    engine = StubEngine(failures=100)
    supervisor, finished = _run(engine, max_restarts=3, backoff_s=0.01, run_for_s=0.5)
    assert finished and len(engine.attempts) == 3 and engine.status == "dead" and supervisor.num_restarts == 0


def test_an_engine_that_stays_up_resets_the_count(monkeypatch):
    monkeypatch.setattr(sup, "STABLE_S", 0.05)
    engine = StubEngine(failures=0)
    supervisor = sup.EngineSupervisor(engine, 0.01, 2, 0.0)

    async def main():
        task = asyncio.ensure_future(supervisor.run())
        for _ in range(4):  # dies four times, each after staying up longer than STABLE_S
            await asyncio.sleep(0.15)
            engine.alive = False
        await asyncio.sleep(0.15)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert supervisor.num_restarts == 5 and engine.status == "ok"
