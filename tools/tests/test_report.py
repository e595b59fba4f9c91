"""Run files and the terminal table, including levels where nothing completed."""

import csv
import json

from lightspeed_bench.metrics import summarize_level
from lightspeed_bench.report import format_table, load_run, write_run


def test_empty_level_keeps_the_table_aligned_and_the_files_valid(tmp_path):
    empty = summarize_level([], concurrency=4, num_gpus=1)
    empty["server_cache"] = None
    full = dict(empty, concurrency=1, requests_measured=3, ttft_ms={"p50": 12.5, "p90": 13.0, "p99": 14.0},
                tpot_ms={"mean": 10.0, "p50": 10.0, "p90": 11.0, "p99": 12.0}, tokens_per_s_per_user=100.0,
                tokens_per_s_per_user_p10=95.0, cached_fraction=0.5, ideal_cached_fraction=0.8)
    lines = format_table([full, empty]).splitlines()
    assert len({len(line) for line in lines}) == 1
    run = {"label": "x", "server": {"base_url": "http://h"}, "model": "m", "date": "d", "git_commit": "c",
           "flags": {"concurrency": [1, 4]}, "levels": [full, empty]}
    json_path, csv_path = write_run(run, tmp_path / "sub" / "r")
    assert load_run(json_path)["levels"][1]["ttft_ms"]["p50"] is None
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["concurrency"] for r in rows] == ["1", "4"] and rows[1]["ttft_ms_p50"] == ""
    assert json.loads(rows[0]["flags"]) == {"concurrency": [1, 4]}
