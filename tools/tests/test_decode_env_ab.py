"""tools/bench/decode_env_ab.py end to end on the CPU (--smoke: the Triton interpreter on tiny shapes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def run(tmp_path, *args):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "decode_env_ab.py", "--out", str(tmp_path), *args], cwd=BENCH, env=env,
                          capture_output=True, text=True, timeout=600)


def test_smoke_times_both_arms_of_every_shape_and_they_agree(tmp_path):
    proc = run(tmp_path, "--smoke", "--var", "LIGHTSPEED_KERNEL_DECODE_SMALL_GRID", "--values", "1,0",
               "--shapes", "16:1:48,8:2:40", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("decode_env_ab_*.json")
    result = json.loads(path.read_text())
    assert result["values"] == ["1", "0"] and result["rounds"] == 2
    assert [(r["page_size"], r["batch"], r["context"]) for r in result["rows"]] == [(16, 1, 48), (8, 2, 40)]
    for r in result["rows"]:
        assert r["kv_bytes"] == 2 * r["batch"] * r["context"] * 8 * 128 * 2
        base = r["arms"]["1"]
        assert base["over_first"] == 1.0 and len(base["rounds_ms"]) == 2
        assert r["arms"]["0"]["rel_err_vs_first"] < 1e-2  # the other plan computes the same attention
    md = path.with_suffix(".md").read_text()
    assert "| 16 | 1 | 48 |" in md and "| 8 | 2 | 40 |" in md


def test_bad_arguments_are_refused_with_a_message(tmp_path):
    for args, needle in [(["--var", "PATH"], "LIGHTSPEED_KERNEL_"),
                         (["--var", "LIGHTSPEED_KERNEL_PDL", "--shapes", "16:1"], "PAGE:BATCH:CONTEXT"),
                         (["--var", "LIGHTSPEED_KERNEL_PDL", "--values", "1"], "two values")]:
        proc = run(tmp_path, "--smoke", *args)
        assert proc.returncode == 2 and needle in proc.stderr, (args, proc.stderr)
