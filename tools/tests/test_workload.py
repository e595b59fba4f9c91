"""Workload generation: determinism, sizing, sharing structure, traces, renderings."""

import json
import random

import pytest
from lightspeed_bench.runner import common_prefix_len
from lightspeed_bench.textgen import sized_text
from lightspeed_bench.tokenizer import TokenCounter, crude_count
from lightspeed_bench.workload import (
    AgenticSpec,
    agentic_conversations,
    calibrate,
    load_trace,
    random_conversations,
    render_completion_prompt,
    salted,
    system_prompt,
)

WORDS = TokenCounter("words", lambda text: len(text.split()))


def test_sized_text_is_deterministic_and_sized():
    a, na = sized_text(7, 3000, WORDS)
    b, nb = sized_text(7, 3000, WORDS)
    c, _ = sized_text(8, 3000, WORDS)
    assert a == b and na == nb and a != c
    assert na == len(a.split()) and abs(na - 3000) <= 60
    small, n_small = sized_text(7, 300, WORDS)
    assert a.startswith(small[:200])  # one stream per seed, cut at different lengths
    assert abs(n_small - 300) <= 10
    assert sized_text(7, 0, WORDS) == ("", 0)


def test_text_is_code_like():
    text, _ = sized_text(1, 2000, TokenCounter("crude", crude_count))
    assert "def " in text and "    " in text and "class " in text
    tool, _ = sized_text(1, 2000, TokenCounter("crude", crude_count), kinds="tool")
    assert "@@ -" in tool and ("PASSED" in tool or "FAILED" in tool)


def test_crude_count_tracks_length():
    assert crude_count("") == 0
    assert crude_count("def f(x):\n    return x") == crude_count("def f(x):\n    return x")
    short, long = "load_page(block, 12)", "load_page(block, 12)\n" * 10
    assert crude_count(long) >= 10 * crude_count(short)


def test_agentic_conversations_share_only_the_system_prompt():
    spec = AgenticSpec(system_prompt_tokens=300, first_turn_tokens=1000, turn_tokens=200,
                       turn_jitter=0.25, turns=4, output_tokens=16, seed=3)
    cpt = calibrate(WORDS)
    system, n_system = system_prompt(spec, WORDS, cpt)
    assert abs(n_system - 300) <= 10
    convs = agentic_conversations(spec, 0, 3, WORDS, cpt, system)
    assert len(convs) == 3 and all(len(c.turns) == 4 for c in convs)
    firsts = [c.turns[0].append for c in convs]
    assert all(f[0] == {"role": "system", "content": system} for f in firsts)
    assert len({f[1]["content"] for f in firsts}) == 3  # repo context differs per conversation
    for conv in convs:
        assert abs(conv.turns[0].new_tokens - 1000) <= 25
        assert all(t.output_tokens == 16 for t in conv.turns)
        tool_sizes = [t.new_tokens for t in conv.turns[1:]]
        assert all(150 * 0.97 <= n <= 250 * 1.03 for n in tool_sizes)
    sizes = [t.new_tokens for c in convs for t in c.turns[1:]]
    assert len(set(sizes)) > 3  # jitter varies the tool results
    again = agentic_conversations(spec, 0, 3, WORDS, cpt, system)
    assert [t.append for t in again[1].turns] == [t.append for t in convs[1].turns]


def test_spec_validation():
    with pytest.raises(ValueError):
        AgenticSpec(turn_jitter=1.5)
    with pytest.raises(ValueError):
        AgenticSpec(turns=0)


def test_random_conversations_are_single_unrelated_turns():
    convs = random_conversations(200, 8, 0, 4, 0, WORDS, calibrate(WORDS))
    assert all(len(c.turns) == 1 for c in convs)
    texts = [c.turns[0].append[0]["content"] for c in convs]
    assert max(common_prefix_len(a, b) for a in texts for b in texts if a is not b) < 50


def test_load_trace_both_shapes(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [
        {"conversation_id": "x", "messages": [{"role": "user", "content": "a"}], "max_tokens": 5},
        {"conversation_id": "y", "append": [{"role": "user", "content": "b"}]},
        {"conversation_id": "x", "messages": [{"role": "user", "content": "a b"}], "output_tokens": 7},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    convs = {c.conv_id: c for c in load_trace(path, default_output_tokens=11)}
    assert [t.output_tokens for t in convs["x"].turns] == [5, 7]
    assert convs["x"].turns[1].full_messages == [{"role": "user", "content": "a b"}]
    assert convs["y"].turns[0].append == [{"role": "user", "content": "b"}]
    assert convs["y"].turns[0].output_tokens == 11
    path.write_text(json.dumps({"conversation_id": "z", "prompt": "?"}) + "\n")
    with pytest.raises(ValueError, match="messages"):
        load_trace(path, 1)


def test_completion_rendering_is_append_only():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}]
    first = render_completion_prompt(msgs)
    second = render_completion_prompt(msgs + [{"role": "assistant", "content": "ans"},
                                              {"role": "user", "content": "u2"}])
    assert second.startswith(first + "ans")


def test_salt_only_touches_the_first_message():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    out = salted(msgs, "abc")
    assert out[0]["content"].startswith("[session abc]") and out[1] == msgs[1]
    assert msgs[0]["content"] == "s" and salted(msgs, "") is msgs


def test_common_prefix_len_matches_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        size = rng.choice((40, 3000))  # short strings and ones long enough to gallop
        a = "".join(rng.choice("ab") for _ in range(rng.randrange(0, size)))
        b = a[: rng.randrange(0, len(a) + 1)] + "".join(rng.choice("ab") for _ in range(rng.randrange(0, 5)))
        a, b = (a, b) if rng.random() < 0.5 else (b, a)
        brute = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix_len(a, b) == brute


def test_local_tokenizer_json(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from lightspeed_bench.tokenizer import choose_counter

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = choose_counter(str(path), "http://127.0.0.1:9", "m", {})
    assert counter.name.startswith("tokenizers:") and counter("a b c\n  d") == 4


def test_crude_counter_is_chosen_explicitly_without_a_server():
    from lightspeed_bench.tokenizer import choose_counter

    counter = choose_counter("crude", "http://127.0.0.1:9", "m", {})
    assert counter.name == "crude-estimate" and counter("def f(x):\n    return x") > 3
