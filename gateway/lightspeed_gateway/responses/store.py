"""Stored responses, for `previous_response_id` and GET /v1/responses/{id}: bounded, in memory or SQLite.

Each entry holds one response object, the input items of its own request, and the id of the
response it continued. A conversation is read back by walking that chain, so a turn costs only
its own items (not the whole history again). Reads refresh an entry's recency, so the ancestors
of a live conversation stay while abandoned ones are evicted (least recently used beyond
`max_entries`); a chain whose ancestor was evicted reports that clearly.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class StoredResponse:
    response: dict                   # the Response object as last returned
    input_items: list[dict]          # this request's own input items, normalised
    previous_response_id: str | None


class MemoryStore:
    """An LRU dict of at most `max_entries` responses."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    async def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    async def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def close(self) -> None:
        self._entries.clear()


class SqliteStore:
    """The same bounded store in a SQLite file (survives restarts); queries run in a worker thread."""

    def __init__(self, path: str, max_entries: int) -> None:
        self.max_entries = max_entries
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, previous_id TEXT, "
                             "response TEXT NOT NULL, input_items TEXT NOT NULL, used REAL NOT NULL)")
            self._db.execute("CREATE INDEX IF NOT EXISTS responses_used ON responses (used)")

    async def get(self, response_id: str) -> StoredResponse | None:
        return await asyncio.to_thread(self._get, response_id)

    async def put(self, response_id: str, entry: StoredResponse) -> None:
        await asyncio.to_thread(self._put, response_id, entry)

    async def delete(self, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, response_id)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute("SELECT response, input_items, previous_id FROM responses WHERE id = ?",
                                   (response_id,)).fetchone()
            if row is None:
                return None
            self._db.execute("UPDATE responses SET used = ? WHERE id = ?", (time.time(), response_id))
        return StoredResponse(json.loads(row[0]), json.loads(row[1]), row[2])

    def _put(self, response_id: str, entry: StoredResponse) -> None:
        response, items = json.dumps(entry.response), json.dumps(entry.input_items)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                             (response_id, entry.previous_response_id, response, items, time.time()))
            self._db.execute("DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY used DESC "
                             "LIMIT -1 OFFSET ?)", (self.max_entries,))

    def _delete(self, response_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0


def open_store(path: str | None, max_entries: int) -> MemoryStore | SqliteStore:
    return SqliteStore(path, max_entries) if path else MemoryStore(max_entries)
