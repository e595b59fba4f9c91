"""The supervisor over engines of several processes: a SIGKILLed tensor-parallel rank is a dead engine
the supervisor restarts (fresh core, fresh ranks, the old ones gone), and data-parallel cores that
step together (expert parallelism across them) all start again at their rendezvous when one dies."""

import asyncio
import os
import signal
import time

import pytest
from gateway_testing import ENGINE_KIND, child_pids, pid_alive
from lightspeed_gateway.server.data_parallel import DataParallelEngine
from lightspeed_gateway.server.engine import EngineClient
from lightspeed_gateway.server.supervisor import EngineSupervisor

pytestmark = pytest.mark.skipif(ENGINE_KIND != "real", reason="needs the real engine's processes")

TINY = dict(model="tiny-qwen3-moe", load_format="dummy", enable_expert_parallel=True, kv_cache_memory="8MiB",
            host_cache_memory="1MiB", max_num_seqs=4, max_model_len=128, num_threads=1)


async def _tokens(client: EngineClient, rid: str) -> list[int]:
    from lightspeed_gateway.server.engine import RequestTiming

    params = client.make_sampling_params(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = []
    async for delta in client.generate(list(range(3, 20)), params, rid, RequestTiming()):
        out += delta.outputs[0].token_ids
    return out


async def _until(condition, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, what
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def _gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(pid_alive(p) for p in pids)


async def _kill_and_recover(client: EngineClient, victim: int) -> tuple[float, float]:
    supervisor = EngineSupervisor(client, interval_s=0.05, max_restarts=2, backoff_s=0.1)
    task = asyncio.ensure_future(supervisor.run())
    try:
        before = await _tokens(client, "before")
        os.kill(victim, signal.SIGKILL)
        dead_after = await _until(lambda: client.dead, 10, "the engine was not seen dead")
        back_after = await _until(lambda: client.status == "ok", 120, "the supervisor did not bring it back")
        assert supervisor.num_restarts == 1
        assert await _tokens(client, "after") == before  # greedy on the same dummy weights
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return dead_after, back_after


def test_a_killed_rank_is_a_dead_engine_the_supervisor_restarts():
    from lightspeed import AsyncLLM

    async def main():
        llm = AsyncLLM(**TINY, tensor_parallel_size=2)
        client = EngineClient(llm)
        old = [llm.engine_pid, *llm.engine_info.rank_pids]
        try:
            dead_after, back_after = await _kill_and_recover(client, old[1])
            new = [llm.engine_pid, *llm.engine_info.rank_pids]
            assert len(new) == 2 and not set(new) & set(old) and all(pid_alive(p) for p in new)
            assert _gone(old), "a process of the dead engine outlived it"
        finally:
            llm.shutdown()
        assert _gone(new), "a rank outlived its engine's shutdown"
        print(f"\nTP 2: rank SIGKILLed -> engine dead after {dead_after:.2f} s, back after {back_after:.1f} s")

    asyncio.run(main())


def test_cores_that_step_together_all_restart_when_one_dies():
    from lightspeed import EngineConfig

    async def main():
        engine = DataParallelEngine.start(EngineConfig(**TINY, data_parallel_size=2))
        client = EngineClient(engine)
        old = engine.engine_pids
        try:
            assert engine.cores[0].config.master_port == engine.cores[1].config.master_port  # one world
            assert engine.steps_together and client.num_cores == 0  # watched and restarted as one engine
            dead_after, back_after = await _kill_and_recover(client, old[1])
            new = engine.engine_pids
            assert not set(new) & set(old) and all(pid_alive(p) for p in new)
            assert _gone(old) and not [p for p in old for c in child_pids(p) if pid_alive(c)]
        finally:
            engine.shutdown()
        assert _gone(new)
        print(f"\nDP 2 x EP 2: core SIGKILLed -> engine dead after {dead_after:.2f} s, all back after "
              f"{back_after:.1f} s")

    asyncio.run(main())
