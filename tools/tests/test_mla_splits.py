"""tools/bench/mla_splits.py on the CPU: which split counts it sweeps, and its table."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
import mla_splits  # noqa: E402


def test_sweeps_the_planner_count_its_fractions_double_and_one():
    assert mla_splits.candidate_splits(128, 81920) == [1, 32, 64, 96, 128]  # MAX_SPLITS caps the doubling
    assert mla_splits.candidate_splits(8, 81920) == [1, 2, 4, 6, 8, 16]
    assert mla_splits.candidate_splits(1, 512) == [1, 2]  # splits of >= 256 keys only
    assert mla_splits.candidate_splits(33, 1000) == [1]  # 3 splits at most, none of the candidates


def test_markdown_marks_the_planner_count(tmp_path):
    row = {"kind": "bf16", "batch": 1, "heads": 16, "q_len": 4, "ctx": 81920, "splits": 128, "planner": True,
           "combine": "blocked", "us": 69.4, "of_roofline": 0.319, "roofline_us": 22.1,
           "eager_us": {"decode": 50.0, "combine": 9.0, "other": 0.0}, "err_vs_first": 0.0}
    result = {"kernel": "mla_decode_sm90", "device": "NVIDIA H200", "torch": "2.11", "commit": "abc", "rows": [row]}
    path = tmp_path / "t.md"
    mla_splits.write_markdown(result, path)
    text = path.read_text()
    assert "| bf16 | 1 | 16 | 4 | 81920 | 128 * | blocked | 69.4 | 0.319 | 50.0 | 9.0 | 0.0 |" in text
