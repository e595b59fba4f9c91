"""The re-quoting trace: valid for `--trace`, deterministic, and its turns re-quote context."""

from lightspeed_bench import load_trace
from lightspeed_bench.requote import write_requote_trace


def test_trace_loads_and_turns_quote_the_file(tmp_path):
    path = write_requote_trace(tmp_path / "t.jsonl", conversations=3, turns=4, output_tokens=64)
    again = write_requote_trace(tmp_path / "u.jsonl", conversations=3, turns=4, output_tokens=64)
    assert path.read_text() == again.read_text()
    convs = load_trace(path, 10)
    assert [len(c.turns) for c in convs] == [4, 4, 4]
    first = convs[0].turns[0].full_messages[1]["content"]
    module = first.split("```python\n")[1].split("```")[0]
    cat = convs[0].turns[1].append[0]["content"]
    # The tool's copy is the module with the requested rename applied: long verbatim spans.
    assert "_v2(" in cat and len(module) > 1500
    assert sum(line in cat for line in module.splitlines()) > 0.9 * len(module.splitlines())
    assert all(t.output_tokens == 64 for c in convs for t in c.turns)
