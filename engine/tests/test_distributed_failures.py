"""A rank that dies stops its engine with a message naming it, and leaves no process behind (a
normal shutdown stopping every rank is checked by test_openai_client_tp2.py and the engine tests)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from lightspeed import LLM, EngineDeadError, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":  # a zombie is dead too
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


def _tp2() -> LLM:
    return LLM("tiny-qwen3-moe", load_format="dummy", tensor_parallel_size=2, enable_expert_parallel=True,
               kv_cache_memory="8MiB", host_cache_memory="1MiB", max_num_seqs=4, max_model_len=128, num_threads=1)


def test_killing_a_rank_stops_the_engine_with_a_clear_error():
    llm = _tp2()
    try:
        core, ranks = llm.engine.engine_pid, llm.engine.engine_info.rank_pids
        assert len(ranks) == 1
        assert len(llm.generate([list(range(3, 20))], GREEDY)[0].outputs[0].token_ids) == 4
        os.kill(ranks[0], signal.SIGKILL)
        with pytest.raises(EngineDeadError, match=r"rank 1 \(pid \d+\) was killed by signal SIGKILL"):
            for _ in range(50):  # the engine notices within its watchdog's interval
                llm.generate([list(range(3, 20))], SamplingParams(max_tokens=64, ignore_eos=True))
                time.sleep(0.1)
        assert _gone(core) and _gone(ranks[0])
    finally:
        llm.shutdown()



def test_a_failed_step_of_two_ranks_is_fatal_and_stops_them(monkeypatch):
    """One rank carries on after a failed step (test_engine_faults.py); two cannot: the other rank is
    left inside the step's collectives, so the error ends the core (the supervisor restarts it)."""
    from engine_driver import make_engine, submit
    from lightspeed.core.faults import FatalEngineError, is_fatal
    from lightspeed.core.messages import SamplingSpec

    engine = make_engine("tiny-qwen3-moe", tensor_parallel_size=2, enable_expert_parallel=True, max_num_seqs=4,
                         max_model_len=128, num_threads=1)
    ranks = engine.runner.rank_pids
    try:
        submit(engine, "a", list(range(3, 20)), SamplingSpec(max_tokens=4, temperature=0.0, ignore_eos=True))

        def broken(plan):  # rank 0 fails after the step packet went out
            raise RuntimeError("injected fault in rank 0's forward")

        monkeypatch.setattr(engine.runner.runner, "launch", broken)
        with pytest.raises(FatalEngineError, match=r"a step of 2 ranks failed on rank 0 \(RuntimeError\).*injected fault") as failed:
            engine.step()
        assert is_fatal(failed.value)
    finally:
        engine.runner.shutdown(graceful=False)
    assert all(_gone(pid, timeout=10) for pid in ranks)
