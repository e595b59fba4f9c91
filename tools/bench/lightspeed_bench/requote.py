"""A re-quoting agentic trace: coding-agent sessions whose turns ask the model to repeat and edit
file content already in its context (the case prompt-lookup and suffix drafting are for).

Each conversation: turn 1 shows a Python module and asks for it back with a rename; later turns
append the module as a tool would print it after the edit (`cat`), a diff, or a test log, and ask
for the whole file (or a function of it) again with another small change. Turns after the first
are "append" lines, so each prompt is the previous one plus the answer actually given: a later
turn may also re-quote the model's own earlier answer. Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from .textgen import diff_hunk, source_file, test_log

SYSTEM = ("You are a coding agent. When asked for a file, print it completely in one ```python block, "
          "with exactly the requested changes and nothing else changed.")


def _module(rng: random.Random, min_lines: int) -> list[str]:
    lines: list[str] = []
    while len(lines) < min_lines:
        lines += source_file(rng)
    return lines


def conversation(index: int, seed: int, turns: int, file_lines: int, output_tokens: int) -> list[dict]:
    """The trace lines of one conversation."""
    rng = random.Random(f"requote:{seed}:{index}")
    lines = _module(rng, file_lines)
    text = "\n".join(lines)
    functions = re.findall(r"def (\w+)\(", text) or ["main"]
    name = f"module_{index}.py"
    first = functions[0]
    conv_id = f"requote-{index}"
    out = [{"conversation_id": conv_id, "output_tokens": output_tokens, "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Here is `{name}`:\n```python\n{text}\n```\n"
                                    f"Rename `{first}` to `{first}_v2` and print the complete updated file."}]}]
    text = text.replace(f"def {first}(", f"def {first}_v2(")
    for turn in range(1, turns):
        kind = turn % 3
        target = functions[turn % len(functions)]
        if kind == 1:
            tool = f"$ cat {name}\n```python\n{text}\n```"
            ask = f"Add a type-checked early return at the top of `{target}` and print the complete file again."
        elif kind == 2:
            tool = "$ git diff\n```diff\n" + "\n".join(diff_hunk(rng)) + "\n```"
            ask = f"Print the final version of `{name}` once more, unchanged."
        else:
            tool = "$ pytest -q\n" + "\n".join(test_log(rng))
            ask = f"Quote the function `{target}` from `{name}` exactly as it is, then print it again fixed."
        out.append({"conversation_id": conv_id, "output_tokens": output_tokens,
                    "append": [{"role": "user", "content": f"Tool output:\n{tool}\n\n{ask}"}]})
    return out


def write_requote_trace(path: str | Path, *, conversations: int = 32, turns: int = 4, file_lines: int = 60,
                        output_tokens: int = 400, seed: int = 0) -> Path:
    """Write the JSONL trace (`lightspeed-bench agentic --trace PATH`); returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for index in range(conversations):
            for line in conversation(index, seed, turns, file_lines, output_tokens):
                f.write(json.dumps(line) + "\n")
    return path
