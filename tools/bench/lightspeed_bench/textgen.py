"""Deterministic, code-like filler text sized in tokens.

Agentic prompts are mostly source files, diffs and tool logs. Prose filler tokenizes very
differently (fewer, longer tokens), so the generator writes Python-looking modules, unified
diffs and test-runner output from a seeded RNG: the same seed gives the same text on every
machine, which keeps runs against different servers comparable.
"""

from __future__ import annotations

import random
from collections.abc import Callable

_NOUNS = (
    "request", "page", "block", "cache", "token", "batch", "layer", "tensor", "node", "prefix",
    "queue", "worker", "config", "model", "shard", "kernel", "buffer", "stream", "session", "plan",
    "slot", "span", "record", "index", "graph", "router", "expert", "weight", "scale", "offset",
)
_VERBS = (
    "load", "store", "build", "merge", "split", "fetch", "flush", "evict", "match", "insert",
    "encode", "decode", "resolve", "update", "schedule", "allocate", "release", "compute", "emit",
    "parse", "render", "verify", "apply", "collect", "reset", "launch", "prepare", "select",
)
_ADJS = ("free", "hot", "cold", "local", "remote", "max", "min", "next", "last", "raw", "dense",
         "sparse", "paged", "cached", "pending", "stale", "shared", "ragged")
_TYPES = ("int", "float", "str", "bool", "list[int]", "dict[str, int]", "np.ndarray", "bytes")
_MODULES = ("engine", "scheduler", "gateway", "kernel", "runner", "loader", "sampler", "pool")


def _ident(rng: random.Random) -> str:
    parts = [rng.choice(_ADJS)] if rng.random() < 0.4 else []
    parts.append(rng.choice(_NOUNS))
    if rng.random() < 0.3:
        parts.append(rng.choice(_NOUNS))
    return "_".join(parts)


def _func_name(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{_ident(rng)}"


def _class_name(rng: random.Random) -> str:
    return "".join(w.capitalize() for w in (rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_NOUNS)))


def _statement(rng: random.Random, depth: int) -> list[str]:
    pad = "    " * depth
    kind = rng.randrange(7)
    a, b, c = _ident(rng), _ident(rng), _ident(rng)
    if kind == 0:
        return [f"{pad}{a} = {b}.{_func_name(rng)}({c}, {rng.randrange(1, 4096)})"]
    if kind == 1:
        return [f"{pad}if {a} is None or len({b}) > {rng.randrange(2, 512)}:",
                f"{pad}    raise ValueError(f\"bad {a}: {{{a}!r}}\")"]
    if kind == 2:
        return [f"{pad}for {a} in range({b}.{rng.choice(_NOUNS)}_count):",
                f"{pad}    {c}[{a}] = {_func_name(rng)}({a}, {b})"]
    if kind == 3:
        return [f"{pad}# {rng.choice(_VERBS)} the {b} before the {c} is {rng.choice(_VERBS)}d"]
    if kind == 4:
        return [f"{pad}{a}: {rng.choice(_TYPES)} = {rng.choice(['0', 'None', '[]', '{}', 'False'])}"]
    if kind == 5:
        return [f"{pad}self.{a} += {b} * {rng.randrange(2, 64)}"]
    return [f"{pad}return {a}, {b}"]


def _function(rng: random.Random, depth: int) -> list[str]:
    pad = "    " * depth
    args = ", ".join(f"{_ident(rng)}: {rng.choice(_TYPES)}" for _ in range(rng.randrange(1, 4)))
    lines = [f"{pad}def {_func_name(rng)}(self, {args}) -> {rng.choice(_TYPES)}:",
             f"{pad}    \"\"\"{rng.choice(_VERBS).capitalize()} {_ident(rng)} for {_ident(rng)}.\"\"\""]
    for _ in range(rng.randrange(3, 9)):
        lines += _statement(rng, depth + 1)
    return lines + [""]


def source_file(rng: random.Random) -> list[str]:
    """One Python-looking module: a path header, imports, a class with a few methods."""
    mod = rng.choice(_MODULES)
    lines = [f"# file: lightspeed/{mod}/{_ident(rng)}.py",
             "from __future__ import annotations", "",
             f"from lightspeed.{rng.choice(_MODULES)} import {_class_name(rng)}", "", "",
             f"class {_class_name(rng)}:"]
    for _ in range(rng.randrange(2, 5)):
        lines += _function(rng, 1)
    return lines + [""]


def diff_hunk(rng: random.Random) -> list[str]:
    """A unified diff hunk, as an agent's edit tool reports it."""
    path = f"lightspeed/{rng.choice(_MODULES)}/{_ident(rng)}.py"
    start = rng.randrange(1, 900)
    lines = [f"--- a/{path}", f"+++ b/{path}", f"@@ -{start},7 +{start},8 @@ def {_func_name(rng)}"]
    for _ in range(rng.randrange(4, 10)):
        body = _statement(rng, rng.randrange(1, 3))[0]
        lines.append(rng.choice((" ", " ", "-", "+")) + body)
    return lines


def test_log(rng: random.Random) -> list[str]:
    """pytest-like output: what a run-tests tool returns."""
    lines = []
    for _ in range(rng.randrange(3, 8)):
        name = f"tests/test_{_ident(rng)}.py::test_{_func_name(rng)}"
        lines.append(f"{name} {rng.choice(('PASSED', 'PASSED', 'PASSED', 'FAILED'))}")
    if rng.random() < 0.5:
        lines += ["    def test_case():", f">       assert {_ident(rng)} == {rng.randrange(100)}",
                  f"E       AssertionError: assert {rng.randrange(100)} == {rng.randrange(100)}"]
    return lines


def code_text(rng: random.Random, approx_chars: int, kinds: str = "source") -> str:
    """Code-like text of roughly `approx_chars` characters (always whole lines).

    kinds: "source" (modules), "tool" (diffs and test logs mixed with snippets).
    """
    pieces: list[str] = []
    size = 0
    while size < approx_chars:
        if kinds == "tool":
            pick = rng.randrange(3)
            block = diff_hunk(rng) if pick == 0 else test_log(rng) if pick == 1 else source_file(rng)[:12]
        else:
            block = source_file(rng)
        for line in block:
            pieces.append(line)
            size += len(line) + 1
            if size >= approx_chars:
                break
    return "\n".join(pieces)


def sized_text(
    seed: int | str,
    target_tokens: int,
    count_tokens: Callable[[str], int],
    kinds: str = "source",
    chars_per_token: float = 3.0,
) -> tuple[str, int]:
    """Deterministic code-like text whose token count is close to `target_tokens`.

    The text for a seed is one infinite stream cut at a character length, so resizing
    keeps it a prefix of the same stream. Two measure-and-rescale rounds land within a
    few percent. Returns (text, measured tokens).
    """
    if target_tokens <= 0:
        return "", 0
    rng = random.Random(f"{seed}")
    stream = code_text(rng, int(target_tokens * chars_per_token * 1.6) + 256, kinds)
    length = min(len(stream), max(1, int(target_tokens * chars_per_token)))
    text = stream[:length]
    tokens = count_tokens(text)
    for _ in range(3):
        if tokens == 0 or abs(tokens - target_tokens) <= max(2, target_tokens // 50):
            break
        length = max(1, int(length * target_tokens / tokens))
        if length > len(stream):
            stream = code_text(random.Random(f"{seed}"), length * 2, kinds)
        text = stream[:length]
        tokens = count_tokens(text)
    return text, tokens
