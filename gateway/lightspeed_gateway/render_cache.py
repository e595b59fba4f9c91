"""The chat renderer's memory of conversations it has rendered: prefix boundaries keyed by message hashes.

Design note: an agent resends its whole conversation every turn, so rendering and tokenising it
from scratch costs O(conversation) per turn and O(N^2) over a session. The renderer remembers, per
request, the rendered text and token ids of all its messages (a *boundary*). The next turn hashes
its messages as a chain (key i names the first i messages together with the template, the tools
and the template arguments), finds the longest remembered prefix, and only renders and tokenises
the messages after it. Entries are bounded by the number of token ids held (LRU); an entry that a
longer one of the same conversation extends is dropped, since the conversation has moved on.
"""

from __future__ import annotations

import hashlib
import json
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Boundary:
    """A rendered conversation prefix, without generation prompt."""

    text: str                       # the template's rendering of the messages so far
    token_ids: array                # their token ids, tokenised piece by piece ('i' array: 4 bytes each)
    generation_prompt: str | None   # what add_generation_prompt appended after `text`, when known


EMPTY = Boundary("", array("i"), None)


def canonical(value: object) -> bytes:
    """A stable byte form of JSON-like data (key order and spacing do not matter)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str).encode()


def prefix_keys(seed: bytes, messages: list[dict]) -> list[bytes]:
    """keys[i] names messages[:i] under `seed` (template, tools, template arguments); len = N + 1."""
    key = hashlib.blake2b(seed, digest_size=16).digest()
    keys = [key]
    for message in messages:
        key = hashlib.blake2b(key + canonical(message), digest_size=16).digest()
        keys.append(key)
    return keys


class TokenBoundedLRU:
    """An LRU map bounded by the total number of token ids its values hold (`len` of each value, or
    of its `token_ids`). Thread-safe: the renderer runs in a worker pool."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._entries: OrderedDict[bytes, object] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _size(value) -> int:
        return len(getattr(value, "token_ids", value))

    def _get_locked(self, key: bytes):
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def _put(self, key: bytes, value, supersedes: bytes | None = None) -> None:
        """Remember `value` under `key` (nothing if it alone exceeds the bound); `supersedes` names an
        entry it replaces (dropped), then the least recently used go until the bound holds."""
        size = self._size(value)
        if size > self.max_tokens:
            return
        with self._lock:
            if supersedes is not None and supersedes != key:
                self._drop(supersedes)
            self._drop(key)
            self._entries[key] = value
            self.num_tokens += size
            while self.num_tokens > self.max_tokens:
                _, old = self._entries.popitem(last=False)
                self.num_tokens -= self._size(old)

    def _drop(self, key: bytes) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.num_tokens -= self._size(old)


class RenderCache(TokenBoundedLRU):
    """Boundaries by prefix key, bounded by the token ids they hold."""

    def longest(self, keys: list[bytes]) -> tuple[int, Boundary]:
        """(i, boundary) for the longest remembered prefix keys[i] (i >= 1), else (0, EMPTY)."""
        with self._lock:
            for i in range(len(keys) - 1, 0, -1):
                found = self._get_locked(keys[i])
                if found is not None:
                    return i, found
        return 0, EMPTY

    def put(self, key: bytes, boundary: Boundary, supersedes: bytes | None = None) -> None:
        """Remember `boundary` under `key`; `supersedes` is the entry it extends (dropped)."""
        self._put(key, boundary, supersedes)


class AnswerTokens(TokenBoundedLRU):
    """The token ids the engine generated for answer texts, so that an answer sent back as the
    assistant message of the next turn is tokenised as it was generated.

    Design note: an agent sends the model's previous answer back as text, and tokenising that text
    need not give back the generated ids (BPE merges across what were separate generated tokens: a
    64-token answer of a dummy model re-tokenised to 66). The prefix cache then stops matching a few
    tokens into the previous answer, and every later turn prefills the rest of it again. Splicing the
    generated ids keeps the whole answer cached; they decode to exactly the same text (checked when
    remembered), so the prompt means what the client sent, in the tokens the model itself chose.
    Keyed by a digest of the text; LRU bounded by the token ids held. Thread-safe."""

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()

    def put(self, text: str, token_ids: list[int]) -> None:
        if text and token_ids:
            self._put(self._key(text), array("i", token_ids))

    def get(self, text: str) -> array | None:
        if not text:
            return None
        with self._lock:
            return self._get_locked(self._key(text))
