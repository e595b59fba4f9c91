"""tools/bench/decode_vs_peers.py on the CPU: its smoke run (ours under the Triton interpreter, no peers) writes a
table whose rows are the shapes asked for, and its shape parser refuses what it cannot run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import decode_vs_peers  # noqa: E402  (tools/bench/decode_vs_peers.py)


def test_smoke_run_writes_one_row_per_shape_and_names_the_missing_peers(tmp_path):
    proc = subprocess.run([sys.executable, "decode_vs_peers.py", "--smoke", "--out", str(tmp_path),
                           "--shapes", "2:64,1:130"], cwd=BENCH, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("decode_vs_peers_*_cpu-interpreter.json")
    result = json.loads(path.read_text())
    assert [(r["batch"], r["context"]) for r in result["rows"]] == [(2, 64), (1, 128)]  # whole pages
    assert all(r["ours_ms"] > 0 and r["kv_bytes"] == 2 * r["batch"] * r["context"] * 8 * 128 * 2
               for r in result["rows"])
    assert result["vllm_fa3"] == "smoke run" and result["flashinfer"] is None
    table = path.with_suffix(".md").read_text()
    assert table.count("\n| 2 | 64 |") == 1 and "| 1 | 128 |" in table


def test_shapes_parse_to_whole_pages_and_bad_ones_are_refused():
    assert decode_vs_peers.parse_shapes("16:23552,32:1100") == [(16, 23552), (32, 1088)]
    for bad in ("0:1024", "4:8", "4"):
        with pytest.raises(ValueError):
            decode_vs_peers.parse_shapes(bad)


def test_no_gpu_without_smoke_is_a_clear_error(capsys):
    if decode_vs_peers.torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    assert decode_vs_peers.main(["--out", "/tmp/unused"]) == 2
    assert "--smoke" in capsys.readouterr().err
