"""The bounded response stores (memory, SQLite) and conversation chains over them."""

import asyncio

import pytest
from lightspeed_gateway.openai.errors import APIError
from lightspeed_gateway.responses.api import conversation
from lightspeed_gateway.responses.store import MemoryStore, SqliteStore, StoredResponse


def entry(n: int, previous: str | None = None) -> StoredResponse:
    output = [{"type": "message", "id": f"msg_{n}", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": f"answer {n}", "annotations": []}]}]
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"question {n}"}]}]
    return StoredResponse({"id": f"resp_{n}", "status": "completed", "output": output}, items, previous)


def stores(tmp_path):
    return [MemoryStore(3), SqliteStore(str(tmp_path / "responses.sqlite"), 3)]


@pytest.mark.parametrize("kind", [0, 1])
def test_store_is_bounded_lru(tmp_path, kind):
    async def run():
        store = stores(tmp_path)[kind]
        for n in range(3):
            await store.put(f"resp_{n}", entry(n))
        assert (await store.get("resp_0")).response["id"] == "resp_0"  # now most recently used
        await store.put("resp_3", entry(3))
        assert await store.get("resp_1") is None  # the least recently used went
        assert all([await store.get(f"resp_{n}") for n in (0, 2, 3)])
        assert await store.delete("resp_0") and not await store.delete("resp_0")
        store.close()

    asyncio.run(run())


def test_sqlite_store_survives_a_restart(tmp_path):
    async def run():
        path = str(tmp_path / "responses.sqlite")
        store = SqliteStore(path, 10)
        await store.put("resp_1", entry(1))
        store.close()
        again = SqliteStore(path, 10)
        assert (await again.get("resp_1")).input_items == entry(1).input_items
        again.close()

    asyncio.run(run())


def test_conversation_walks_the_chain_and_reports_a_lost_ancestor():
    async def run():
        store = MemoryStore(3)
        await store.put("resp_1", entry(1))
        await store.put("resp_2", entry(2, "resp_1"))
        items = await conversation(store, "resp_2")
        texts = [item["content"][0]["text"] for item in items]
        assert texts == ["question 1", "answer 1", "question 2", "answer 2"]
        assert items[1] == {"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": "answer 1"}]}
        await store.delete("resp_1")
        with pytest.raises(APIError) as info:
            await conversation(store, "resp_2")
        assert info.value.status == 400 and "resp_1" in info.value.message
        assert info.value.param == "previous_response_id"

    asyncio.run(run())
