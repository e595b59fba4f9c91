"""tools/bench/mla.py's --candidates / --points: kernels side by side on the same inputs, one row each,
errors recorded as rows, the table rendering them."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import mla  # noqa: E402


def test_points_selection():
    seeds = mla.select_points("seeds")
    assert [(p[1], p[2]) for p in seeds] == [(k, b) for b in (4, 8, 16) for k in ("fp8", "bf16")]
    assert all(p[3:6] == (16, 4, 81920) for p in seeds)
    small = mla.select_points("small")
    assert small[:6] == seeds and len(small) == 6 + 16 and all(p[2] <= 16 for p in small)
    assert len(mla.select_points("all")) == len(mla.decode_points())


class _FakeBench:
    """bench.run as DecodeBench has it: a row, and the output kept in last_out."""

    def __init__(self, outputs):
        self.outputs, self.calls = outputs, []

    def run(self, kind, b, h, ql, ctx, fold=None, impl=None, seed=None):
        self.calls.append((impl.name, seed))
        if impl.name == "refuses":
            raise ValueError("bf16 caches only")
        self.last_out = self.outputs[impl.name]
        return {"kind": kind, "batch": b, "heads": h, "q_len": ql, "ctx": ctx, "us": 10.0}


class _Impl:
    def __init__(self, name):
        self.name = name

    def plan(self):
        pass

    def run(self):
        pass


def test_candidates_share_a_seed_and_are_checked_against_the_first():
    base = torch.ones(4, 8)
    bench = _FakeBench({"a": base, "b": base * 1.01})
    cands = {"a": _Impl("a"), "b": _Impl("b"), "refuses": _Impl("refuses"), "missing": "KernelSelectionError: x",
             "fp8_only": mla._KindLimited(_Impl("fp8_only"), ("fp8",))}
    rows = mla.run_candidates(bench, cands, "seeds", "bf16", 4, 16, 4, 81920, None)
    assert [r["kernel"] for r in rows] == ["a", "b", "refuses", "missing"]  # fp8_only: not on a bf16 point
    assert len({seed for _, seed in bench.calls}) == 1  # same pages and queries for every kernel
    assert rows[0]["err_vs_first"] == 0.0 and abs(rows[1]["err_vs_first"] - 0.01) < 1e-4
    assert rows[2]["error"].startswith("ValueError: bf16 caches only") and rows[3]["error"].startswith("Kernel")


def test_the_candidates_table(tmp_path):
    rows = [dict(kernel="mla_decode_triton", tag="seeds", kind="bf16", batch=4, heads=16, q_len=4, ctx=81920, us=273.0,
                 roofline_us=88.4, of_roofline=0.324, hbm_frac=0.32, tflops=20.0, splits=8, err_vs_first=0.0),
            dict(kernel="mla_decode_sm90", tag="seeds", kind="fp8", batch=4, heads=16, q_len=4, ctx=81920,
                 error="ValueError: bf16 caches only")]
    results = {"device": "NVIDIA H200", "commit": "abc", "date": "today", "torch": "2", "triton": "3",
               "ceilings": {}, "prefill": [], "fold_speedup": [], "decode": rows, "skipped": [], "tile_sweep": [],
               "flashinfer": None}
    path = tmp_path / "t.md"
    mla.write_markdown(results, path)
    text = path.read_text()
    assert "| mla_decode_triton | seeds | bf16 | 4 | 16 | 4 | 81920 | 273.0 | 88.4 | 0.324 | 0.32 | 20.0 | 8 | 0.0 |" in text
    assert "| mla_decode_sm90 | seeds | fp8 | 4 | 16 | 4 | 81920 | error: ValueError: bf16 caches only |" in text
