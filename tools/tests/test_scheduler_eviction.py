"""tools/bench/scheduler_eviction.py end to end on the CPU: both policies on the H200 memory-pressure shape."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_both_policies_run_and_queue_aware_eviction_hits_more(tmp_path):
    proc = subprocess.run([sys.executable, "scheduler_eviction.py", "--shapes", "h200_pressure", "--concurrency", "16",
                           "--conversations", "16", "--write-through-pages", "256", "--out", str(tmp_path)],
                          cwd=BENCH, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("scheduler_eviction_*.json")
    result = json.loads(path.read_text())
    rows = {r["policy"]: r for r in result["rows"]}
    assert set(rows) == {"lru", "queue"} and result["commit"]
    for r in rows.values():
        assert r["tokens_to_prefill"] == r["prompt_tokens"] - r["hit_tokens"] > 0
        assert 0 < r["hit_fraction"] < 1 and r["plans"] > 0
    assert rows["queue"]["hit_fraction"] > rows["lru"]["hit_fraction"]
    assert (tmp_path / path.name.replace(".json", ".md")).read_text().count("| h200_pressure |") == 2
