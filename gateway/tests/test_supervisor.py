"""EngineSupervisor's policy on a stand-in engine: immediate first restart, exponential back-off, bounded
attempts, then "dead" for good (the real restart is in test_serve_faults.py)."""

import asyncio
import time
from types import SimpleNamespace

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


class StubCores:
    """The part of DataParallelEngine that EngineClient uses for cores that fail alone; core d's restart
    fails `failures[d]` times."""

    def __init__(self, failures: list[int]):
        self.failures, self.attempts = failures, [0] * len(failures)
        self.down: set[int] = set()
        self.engine_info = SimpleNamespace(max_model_len=64, page_size=16, vocab_size=100)
        self.cores = [SimpleNamespace(engine_pid=100 + d) for d in range(len(failures))]
        self.engine_pid, self.independent_cores = 100, len(failures)

    def get_tokenizer(self):
        return list(range(100))

    def core_errored(self, core: int) -> bool:
        return core in self.down

    @property
    def errored(self) -> bool:
        return len(self.down) == len(self.cores)

    async def restart_core(self, core: int) -> None:
        self.attempts[core] += 1
        if self.attempts[core] <= self.failures[core]:
            raise RuntimeError("the model did not load")
        self.down.discard(core)


def test_cores_that_fail_alone_restart_alone_and_give_up_alone():
    cores = StubCores([0, 100])
    client = EngineClient(cores)
    supervisor = sup.EngineSupervisor(client, 0.01, 3, 0.01)

    async def main():
        task = asyncio.ensure_future(supervisor.run())
        cores.down = {0, 1}  # both die: the engine is down, both come back on their own schedules
        await asyncio.sleep(0.3)
        statuses = client.core_statuses(), client.status
        cores.down.add(0)  # core 0 dies again, alone: core 1 gave up, so nothing serves until 0 is back
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return statuses

    assert asyncio.run(main()) == (["ok", "dead"], "ok")
    assert cores.attempts == [2, 3] and supervisor.num_restarts == 2
    assert client.core_statuses() == ["ok", "dead"] and client.status == "ok" and not client.given_up


def test_the_engine_is_dead_once_every_core_gave_up():
    cores = StubCores([100, 100])
    client = EngineClient(cores)
    cores.down = {0, 1}
    supervisor, finished = _run(client, max_restarts=2, backoff_s=0.01, run_for_s=0.3)
    assert finished and cores.attempts == [2, 2] and client.core_statuses() == ["dead", "dead"]
    assert client.status == "dead" and client.given_up
