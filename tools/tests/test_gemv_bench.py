"""tools/bench/gemv.py end to end on the CPU (--dry-run: the Triton interpreter on tiny shapes)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import gemv as gemv_bench  # noqa: E402  (tools/bench/gemv.py; imports nothing heavy at module level)


def test_dry_run_times_every_shape_and_config_and_writes_results(tmp_path):
    proc = subprocess.run([sys.executable, "gemv.py", "--dry-run", "--out", str(tmp_path)], cwd=BENCH,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = tmp_path.glob("gemv_*.json")
    result = json.loads(path.read_text())
    # gemv_<commit>_<UTC date-time>_<device>.json
    assert re.fullmatch(r"gemv_[0-9a-z-]+_\d{4}-\d\d-\d\d_\d{6}_cpu-interpreter\.json", path.name), path.name
    assert path.name.startswith(f"gemv_{result['commit'].replace('+', '-')}_")
    assert result["dry_run"] and result["device"] == "cpu-interpreter"
    want = {(m, n, k) for m in gemv_bench.DRY_ROWS for n, k in gemv_bench.DRY_SHAPES}
    assert {(r["m"], r["n"], r["k"]) for r in result["rows"]} == want
    for r in result["rows"]:
        assert r["configs"][0]["config"] == r["chosen"] and len(r["configs"]) == gemv_bench.DRY_CONFIGS
        assert r["bytes"] == 2 * (r["n"] * r["k"] + r["m"] * r["k"] + r["m"] * r["n"])
        for c in [r["cublas"], *r["configs"]]:
            assert c["us"] > 0 and c["of_peak"] == pytest.approx(c["tbs"] / gemv_bench.HBM_PEAK_TBS)
            assert c["tbs"] == pytest.approx(r["bytes"] / c["us"] / 1e6)
        assert all(c["rel_err"] < gemv_bench.BAD_REL_ERR for c in r["configs"])  # the kernel matched F.linear
        assert r["best"] == min(r["configs"], key=lambda c: c["us"])
    md = path.with_suffix(".md").read_text()
    assert md.count("\n| 1 | 40 x 72 |") == 1 and "not GPU figures" in md


def _row(m, n, k, cublas_us, best_us):
    return {"m": m, "n": n, "k": k, "cublas": {"us": cublas_us}, "best": {"us": best_us}}


def test_decode_step_sums_32_layers_and_one_lm_head():
    rows = [_row(1, n, k, 10.0, 8.0) for n, k in gemv_bench.SHAPES[:-1]] + [_row(1, 128256, 4096, 100.0, 90.0)]
    assert gemv_bench._decode_step(rows) == (4 * 32 * 10.0 + 100.0, 4 * 32 * 8.0 + 90.0)
    assert gemv_bench._decode_step(rows[1:]) is None  # a shape missing: no step figure
    rows[0]["best"] = None  # every config failed for one shape
    assert gemv_bench._decode_step(rows) is None


def test_best_skips_wrong_and_failed_configs():
    configs = [{"us": 1.0, "rel_err": 0.5}, {"error": "OutOfResources"}, {"us": 3.0, "rel_err": 1e-3},
               {"us": 2.0, "rel_err": 2e-3}]
    assert gemv_bench._best(configs) == configs[3]
    assert gemv_bench._best(configs[:2]) is None


def test_sample_space_keeps_the_pick_first_and_spreads_the_rest():
    space = list(range(11))  # 0 stands for choose_config's pick
    assert gemv_bench.sample_space(space, None) == space
    assert gemv_bench.sample_space(space, 20) == space
    assert gemv_bench.sample_space(space, 3) == [0, 1, 5, 10]  # both ends of the rest and its middle
    assert gemv_bench.sample_space(space, 1) == [0, 1]
