"""The Python API under faults: delivery survives a request's own failure, sends wait for room instead
of piling up, a killed core is replaced by restart(), a slow stream consumer gets merged outputs."""

import asyncio
import os
import signal
import time

import pytest
from lightspeed import (
    LLM,
    AsyncLLM,
    EngineConfig,
    EngineDeadError,
    RequestFailedError,
    RequestOutputKind,
    SamplingParams,
)
from lightspeed.frontend.output_processor import SequenceState

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _config(tiny_model_dir, default_model_path, **overrides) -> EngineConfig:
    settings = dict(model=tiny_model_dir, load_format="dummy", tokenizer=default_model_path, kv_cache_memory="8MiB",
                    host_cache_memory="1MiB", max_num_seqs=4, max_model_len=128, num_threads=1)
    return EngineConfig(**{**settings, **overrides})


async def _collect(llm, prompt, params=GREEDY, request_id=None) -> list[int]:
    final = None
    async for out in llm.generate(prompt, params, request_id=request_id):
        final = out
    return final.outputs[0].token_ids


def test_a_failure_while_processing_one_output_fails_only_that_request(tiny_model_dir, default_model_path,
                                                                        monkeypatch):
    append = SequenceState.append

    def poisoned(self, token, *args):
        if self.engine_id == "bad":
            raise RuntimeError("injected detokenizer fault")
        return append(self, token, *args)

    monkeypatch.setattr(SequenceState, "append", poisoned)

    async def main():
        llm = AsyncLLM(config=_config(tiny_model_dir, default_model_path))
        try:
            results = await asyncio.gather(_collect(llm, [5, 6, 7], request_id="bad"),
                                           _collect(llm, [5, 6, 7], request_id="good"), return_exceptions=True)
            later = await _collect(llm, [5, 6, 7])
            return results, later, llm.stats()
        finally:
            llm.shutdown()

    (bad, good), later, stats = asyncio.run(main())
    assert isinstance(bad, RequestFailedError) and "RuntimeError" in str(bad)
    assert good == later and len(good) == 6 and stats["engine_alive"]


def test_a_message_that_fails_to_dispatch_fails_its_requests_and_delivery_goes_on(tiny_model_dir,
                                                                                   default_model_path):
    async def main():
        llm = AsyncLLM(config=_config(tiny_model_dir, default_model_path))
        on_step, broken = llm._on_step, {"left": 1}

        async def flaky(msg):  # a bug outside any one request's state: the whole message fails
            if msg.request_ids and broken["left"]:
                broken["left"] -= 1
                raise KeyError("a bug in output processing")
            await on_step(msg)

        llm._on_step = flaky
        try:
            first = await asyncio.wait_for(_collect(llm, [5, 6, 7]), 60)
        except RequestFailedError as e:
            first = e
        try:
            later = await asyncio.wait_for(_collect(llm, [5, 6, 7]), 60)
            return first, later, llm.errored
        finally:
            llm.shutdown()

    first, later, errored = asyncio.run(main())
    assert isinstance(first, RequestFailedError) and "KeyError" in str(first), "failed, not left hanging"
    assert len(later) == 6 and not errored


def test_sends_wait_for_room_in_the_engine(tiny_model_dir, default_model_path):
    async def main():
        llm = AsyncLLM(config=_config(tiny_model_dir, default_model_path, max_num_seqs=2, max_queued_requests=2))
        peak = 0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, llm._num_in_flight)
                await asyncio.sleep(0.001)

        watcher = asyncio.ensure_future(watch())
        try:
            outs = await asyncio.gather(*[_collect(llm, [10 + i, 11, 12]) for i in range(12)])
        finally:
            watcher.cancel()
            llm.shutdown()
        return outs, peak

    outs, peak = asyncio.run(main())
    assert all(len(o) == 6 for o in outs) and 2 <= peak <= 4  # max_num_seqs + max_queued_requests


def test_restart_replaces_a_killed_core(tiny_model_dir, default_model_path):
    async def main():
        llm = AsyncLLM(config=_config(tiny_model_dir, default_model_path))
        try:
            old_pid = llm.engine_pid
            long = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
            stream = llm.generate([5, 6, 7], long)
            await stream.__anext__()
            os.kill(old_pid, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(EngineDeadError):
                async for _ in stream:
                    pass
            failed_after = time.monotonic() - started
            assert llm.errored
            with pytest.raises(EngineDeadError):
                await _collect(llm, [5, 6, 7])
            await llm.restart()
            assert llm.engine_pid != old_pid and not llm.errored
            return failed_after, await _collect(llm, [5, 6, 7])
        finally:
            llm.shutdown()

    failed_after, tokens = asyncio.run(main())
    assert failed_after < 2.0 and len(tokens) == 6


def test_a_slow_stream_consumer_gets_merged_outputs(tiny_model_dir, default_model_path):
    llm = LLM(tiny_model_dir, load_format="dummy", tokenizer=default_model_path, kv_cache_memory="8MiB",
              host_cache_memory="1MiB", max_num_seqs=4, max_model_len=256, num_threads=1)
    try:
        params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        deltas = []
        for out in llm.generate_stream([5, 6, 7], params):
            deltas.append(out.outputs[0].token_ids)
            time.sleep(0.05)  # slower than the engine: outputs must merge, not queue up
        full = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    finally:
        llm.shutdown()
    assert [t for d in deltas for t in d] == full[0].outputs[0].token_ids
    assert len(deltas) < 60
