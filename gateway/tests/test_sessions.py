"""Sessions: each API's conversation id reaches the engine as `session_id` (its retention hint)."""

import asyncio
from types import SimpleNamespace

from lightspeed import default_model, load_tokenizer
from lightspeed_gateway.server.engine import EngineClient, RequestTiming


class RecordingLLM:
    """Just enough of AsyncLLM for EngineClient: records what generate() is given."""

    def __init__(self):
        self.engine_info = SimpleNamespace(max_model_len=64, page_size=16, vocab_size=49152)
        self.calls = []

    def get_tokenizer(self):
        return load_tokenizer(default_model())

    async def generate(self, prompt, params, request_id, session_id=None):
        self.calls.append(session_id)
        yield SimpleNamespace(finished=True)


def test_engine_client_passes_the_session_down():
    llm = RecordingLLM()
    client = EngineClient(llm)

    async def run(session):
        return [out async for out in client.generate([1, 2], None, "r", RequestTiming(), session=session)]

    asyncio.run(run("conversation-7"))
    asyncio.run(run(None))
    assert llm.calls == ["conversation-7", None]
