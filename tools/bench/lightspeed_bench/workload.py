"""Workloads: what each conversation sends, turn by turn.

A conversation is a list of turns. A turn either appends messages to the conversation so far
(prompt = previous prompt + the answer the server actually gave + new tool output: append-only,
so a correct prefix cache serves everything but the new tail) or carries a recorded full prompt
(trace replay). Three sources: the synthetic agentic workload, a JSONL trace, random prompts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from .textgen import sized_text
from .tokenizer import TokenCounter

Message = dict[str, str]


@dataclass
class Turn:
    """One request of a conversation."""

    output_tokens: int  # max_tokens (and min_tokens) asked for
    append: list[Message] = field(default_factory=list)  # appended after the previous answer
    full_messages: list[Message] | None = None  # recorded prompt, replayed verbatim (trace mode)
    new_tokens: int = 0  # tokens this turn adds to the prompt, as sized by the generator (0: unknown)


@dataclass
class Conversation:
    """An agent session: its turns run strictly in order, each waiting for the previous answer."""

    conv_id: str
    turns: list[Turn]


@dataclass(frozen=True)
class AgenticSpec:
    """Shape of the synthetic agentic workload (sizes in tokens)."""

    system_prompt_tokens: int = 2000  # identical across all conversations of a level
    first_turn_tokens: int = 30000  # per-conversation repository context
    turn_tokens: int = 800  # tool result appended per later turn
    turn_jitter: float = 0.25  # tool result length is uniform in turn_tokens * (1 ± jitter)
    turns: int = 10  # requests per conversation
    output_tokens: int = 500
    seed: int = 0

    def __post_init__(self):
        if self.turns < 1 or self.output_tokens < 1:
            raise ValueError("turns and output_tokens must be >= 1")
        if not 0 <= self.turn_jitter < 1:
            raise ValueError("turn_jitter must be in [0, 1)")
        if min(self.system_prompt_tokens, self.first_turn_tokens, self.turn_tokens) < 0:
            raise ValueError("token sizes must be >= 0")


# Room left in the context for what sizing cannot see: the chat template, and text that tokenises
# a little longer than measured.
CONTEXT_MARGIN = 0.85
_SIZE_FIELDS = ("system_prompt_tokens", "first_turn_tokens", "turn_tokens", "output_tokens")


def last_turn_tokens(spec: AgenticSpec) -> int:
    """Prompt + output tokens of a conversation's last request, at the longest tool results."""
    return _last_turn(vars(spec))


def _last_turn(sizes: dict[str, float]) -> int:
    per_turn = round(sizes["turn_tokens"] * (1 + sizes["turn_jitter"])) + sizes["output_tokens"]
    return int(sizes["system_prompt_tokens"] + sizes["first_turn_tokens"] + (sizes["turns"] - 1) * per_turn
               + sizes["output_tokens"])


def fit_agentic_spec(given: dict[str, int | float], max_model_len: int | None) -> tuple[AgenticSpec, str | None]:
    """The spec from the flags the user gave (`given`), the others from AgenticSpec's defaults,
    shrunk together when a conversation's last request would not fit the server's context.

    Returns (spec, a note on what was fitted or on a workload that cannot fit; None when nothing to say)."""
    spec = AgenticSpec(**given)
    need = last_turn_tokens(spec)
    budget = (max_model_len or 0) * CONTEXT_MARGIN
    if max_model_len is None or need <= budget:
        return spec, None
    free = [name for name in _SIZE_FIELDS if name not in given]
    fixed = _last_turn({**vars(spec), **{name: 0 for name in free}})
    if not free or need == fixed or fixed >= budget:
        return spec, (f"the last request of a conversation needs about {need} tokens but the server's "
                      f"max_model_len is {max_model_len}: those requests will fail; lower --turns or the token sizes")
    scale = (budget - fixed) / (need - fixed)
    fitted = AgenticSpec(**{**given, **{name: max(1, int(getattr(spec, name) * scale)) for name in free}})
    sizes = ", ".join(f"--{name.replace('_', '-')} {getattr(fitted, name)}" for name in free)
    return fitted, f"workload sized to the server's max_model_len {max_model_len}: {sizes}"


def calibrate(counter: TokenCounter, seed: int = 0) -> float:
    """Characters per token of the generator's text for this tokenizer (one measurement)."""
    from .textgen import code_text

    sample = code_text(random.Random(f"calibrate:{seed}"), 12000)
    return len(sample) / max(1, counter(sample))


def system_prompt(spec: AgenticSpec, counter: TokenCounter, chars_per_token: float) -> tuple[str, int]:
    """The shared system prompt: an agent preamble followed by tool specs written as code."""
    head = ("You are a software engineering agent working in a Python repository. "
            "Use the tools below; answer with a plan and a patch.\n")
    body, n = sized_text(f"{spec.seed}:system", max(0, spec.system_prompt_tokens - counter(head)),
                         counter, "source", chars_per_token)
    return head + body, n + counter(head)


def agentic_conversations(
    spec: AgenticSpec, first_index: int, count: int, counter: TokenCounter, chars_per_token: float,
    system: str,
) -> list[Conversation]:
    """`count` synthetic conversations numbered from `first_index` (levels use disjoint ranges)."""
    convs = []
    for idx in range(first_index, first_index + count):
        rng = random.Random(f"{spec.seed}:conv:{idx}")
        repo, repo_tokens = sized_text(f"{spec.seed}:repo:{idx}", spec.first_turn_tokens, counter,
                                       "source", chars_per_token)
        task = f"\n\nTask {idx}: the test suite fails after the last refactor; find the cause and fix it."
        first = [{"role": "system", "content": system},
                 {"role": "user", "content": f"Repository context:\n{repo}{task}"}]
        turns = [Turn(spec.output_tokens, append=first, new_tokens=repo_tokens)]
        for turn in range(1, spec.turns):
            want = round(spec.turn_tokens * rng.uniform(1 - spec.turn_jitter, 1 + spec.turn_jitter))
            tool, tool_tokens = sized_text(f"{spec.seed}:tool:{idx}:{turn}", want, counter, "tool",
                                           chars_per_token)
            msg = {"role": "user", "content": f"Tool result (step {turn}):\n{tool}"}
            turns.append(Turn(spec.output_tokens, append=[msg], new_tokens=tool_tokens))
        convs.append(Conversation(f"agentic-{idx}", turns))
    return convs


def random_conversations(
    input_tokens: int, output_tokens: int, first_index: int, count: int, seed: int,
    counter: TokenCounter, chars_per_token: float,
) -> list[Conversation]:
    """Independent single-turn requests with unrelated prompts: no prefix to share."""
    convs = []
    for idx in range(first_index, first_index + count):
        text, n = sized_text(f"{seed}:random:{idx}", input_tokens, counter, "tool", chars_per_token)
        turn = Turn(output_tokens, append=[{"role": "user", "content": text}], new_tokens=n)
        convs.append(Conversation(f"random-{idx}", [turn]))
    return convs


def load_trace(path: str | Path, default_output_tokens: int) -> list[Conversation]:
    """Conversations from a JSONL trace; lines of one conversation appear in turn order.

    Each line: {"conversation_id": str, "messages": [...]} (the recorded full prompt) or
    {"conversation_id": str, "append": [...]} (messages appended after the live answer), plus
    optional "output_tokens" (or "max_tokens").
    """
    by_id: dict[str, Conversation] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        rec = json.loads(line)
        conv_id = str(rec.get("conversation_id", rec.get("id", f"line-{lineno}")))
        out = int(rec.get("output_tokens", rec.get("max_tokens", default_output_tokens)))
        if "messages" in rec:
            turn = Turn(out, full_messages=list(rec["messages"]))
        elif "append" in rec:
            turn = Turn(out, append=list(rec["append"]))
        else:
            raise ValueError(f"{path}:{lineno}: a trace line needs 'messages' or 'append'")
        by_id.setdefault(conv_id, Conversation(conv_id, [])).turns.append(turn)
    if not by_id:
        raise ValueError(f"{path}: empty trace")
    return list(by_id.values())


def salted(messages: list[Message], salt: str) -> list[Message]:
    """Prefix the first message with a run/level tag so no earlier run's cache entries match."""
    if not salt or not messages:
        return messages
    first = dict(messages[0])
    first["content"] = f"[session {salt}]\n{first['content']}"
    return [first, *messages[1:]]


def render_completion_prompt(messages: list[Message]) -> str:
    """Plain-text rendering for /v1/completions; append-only like the messages themselves."""
    return "".join(f"### {m['role']}\n{m['content']}\n\n" for m in messages) + "### assistant\n"


def render_key(messages: list[Message]) -> str:
    """A string whose common prefixes track the prompts' common prefixes (for ideal-cache estimates)."""
    return "".join(f"\x00{m['role']}\x01{m['content']}" for m in messages)
