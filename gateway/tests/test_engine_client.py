"""EngineClient on a stand-in engine: the request timeout aborts the request and answers 504, a request
the engine failed is a 500, bookkeeping returns to zero either way."""

import asyncio
from types import SimpleNamespace

import pytest
from lightspeed import RequestFailedError
from lightspeed_gateway.openai.serving import engine_api_error
from lightspeed_gateway.server.engine import EngineClient, RequestFailed, RequestTimeout, RequestTiming


class SlowLLM:
    """Yields one output, then waits `stall_s` (or fails) before the next."""

    engine_info = SimpleNamespace(max_model_len=64, page_size=16, vocab_size=100)
    errored = False

    def __init__(self, stall_s: float = 10.0, fail: bool = False):
        self.stall_s, self.fail, self.aborted = stall_s, fail, []

    def get_tokenizer(self):
        return [0] * 100

    async def generate(self, prompt, params, request_id, **_):
        yield SimpleNamespace(finished=False, outputs=[])
        if self.fail:
            raise RequestFailedError("internal error in the engine while running this request (RuntimeError)")
        await asyncio.sleep(self.stall_s)
        yield SimpleNamespace(finished=True, outputs=[])

    async def abort(self, request_id):
        self.aborted.append(request_id)


async def _consume(client, request_id):
    async for _ in client.generate([1, 2], SimpleNamespace(n=2), request_id, RequestTiming()):
        pass


def test_a_request_past_its_time_is_aborted_and_answered_504():
    llm = SlowLLM()
    client = EngineClient(llm, request_timeout_s=0.2)

    async def main():
        with pytest.raises(RequestTimeout):
            await _consume(client, "r1")  # this task reads the stream: the timeout cancels it
        task = asyncio.current_task()
        return task.cancelling() if hasattr(task, "cancelling") else 0

    assert asyncio.run(main()) == 0  # the timeout's own cancel() was taken back: the task may go on
    assert llm.aborted == ["r1"] and client.num_waiting == 0 and not client.inflight
    error = engine_api_error(RequestTimeout("the request took longer than 0.2 s"))
    assert error.status == 504 and error.code == "request_timeout"


def test_a_request_the_engine_failed_is_a_500_and_others_are_untouched():
    llm = SlowLLM(fail=True)
    client = EngineClient(llm, request_timeout_s=5)

    async def main():
        with pytest.raises(RequestFailed):
            await _consume(client, "bad")

    asyncio.run(main())
    assert client.num_waiting == 0 and not client.inflight and not client.dead
    error = engine_api_error(RequestFailed("internal error"))
    assert error.status == 500 and error.type == "internal_error" and error.code == "request_failed"
