"""tools/bench/mla.py --flashinfer on the CPU: the FlashInfer column over the stand-in of
mla/tests/flashinfer_standin.py (its wrapper computes with our reference, so a bf16 point agrees with
ours exactly), its reason when the library is missing, and the table that carries both."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "bench"))
sys.path.insert(1, str(ROOT / "mla" / "tests"))
from flashinfer_standin import BatchMLAPagedAttentionWrapper as StandIn  # noqa: E402
from flashinfer_standin import install  # noqa: E402
from lightspeed_mla import mla_decode_reference  # noqa: E402
from mla_helpers import make_paged_cache, query_start  # noqa: E402

import mla  # noqa: E402


def _point(kind, lens=(200, 130), q_len=4, heads=16):
    g = torch.Generator().manual_seed(1)
    cache, table = make_paged_cache(kind, 64, list(lens), generator=g)
    qsl = query_start([q_len] * len(lens))
    q = torch.randn(int(qsl[-1]), heads, 576, generator=g).to(torch.bfloat16)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    ours = mla_decode_reference(q, cache, table, seq_lens, qsl, mla.SCALE)[0]
    return cache, table, qsl, seq_lens, q, ours


def _timer(us):
    calls = []

    def time_fn(fn):
        fn()
        calls.append(fn)
        return us

    return time_fn, calls


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_the_column_times_flashinfer_on_the_points_inputs(monkeypatch, kind):
    install(monkeypatch)
    column = mla.FlashInferColumn()
    assert column.why is None and column.info["version"].endswith("+standin")
    cache, table, qsl, seq_lens, q, ours = _point(kind)
    time_fn, calls = _timer(50.0)
    r = column.measure(kind, cache, table, qsl, seq_lens, q, ours, 100.0, 20.0, time_fn)
    assert len(calls) == 1 and StandIn.log == [("plan", "fa2"), ("run", "fa2")]
    assert (r["fi_us"], r["fi_of_roofline"], r["fi_speedup"], r["fi_backend"]) == (50.0, 0.4, 2.0, "fa2")
    assert r["fi_graph"] is False  # the CPU timer ran it eagerly
    if kind == "bf16":
        # our packed cache as it is: the stand-in's reference over its rebuilt page table agrees to bf16
        # rounding (0.0 mostly; CI once saw 1e-4, CPU bf16 GEMMs vary with threading), far below FP8's
        assert r["fi_err"] <= 1e-3
    else:
        assert 0 < r["fi_err"] < 0.05  # FlashInfer's FP8 format requantises the rope
        column.measure(kind, cache, table, qsl, seq_lens, q, ours, 100.0, 20.0, time_fn)
        assert len(column._fp8_copies) == 1  # made once per cache


def test_a_point_flashinfer_fails_is_recorded(monkeypatch):
    install(monkeypatch)
    cache, table, qsl, seq_lens, q, ours = _point("bf16")
    r = mla.FlashInferColumn().measure("bf16", cache, table[:, :1], qsl, seq_lens, q, ours, 100.0, 20.0,
                                       _timer(1.0)[0])
    assert set(r) == {"fi_error"} and "more pages than the page table" in r["fi_error"]


def test_without_the_library_the_column_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", None)
    column = mla.FlashInferColumn()
    assert column.runner is None and "ModuleNotFoundError" in column.info["why"]
    cache, table, qsl, seq_lens, q, ours = _point("bf16")
    assert column.measure("bf16", cache, table, qsl, seq_lens, q, ours, 100.0, 20.0, _timer(1.0)[0]) == {}


def _results(flashinfer, rows):
    return {"device": "NVIDIA H200", "commit": "abc", "date": "today", "torch": "2", "triton": "3", "ceilings": {},
            "prefill": [], "fold_speedup": [], "decode": rows, "skipped": [], "tile_sweep": [],
            "flashinfer": flashinfer}


def test_the_table_puts_flashinfer_beside_ours_or_says_why(tmp_path):
    ours = dict(kind="fp8", batch=4, heads=16, q_len=4, ctx=81920, us=364.0, roofline_us=49.6, of_roofline=0.136,
                hbm_frac=0.14, tflops=10.0, bound="memory", fold=True, splits=8, tile="64x32 w8 s2")
    rows = [dict(ours, tag="seeds", fi_us=91.0, fi_of_roofline=0.545, fi_speedup=4.0, fi_err=0.012, fi_backend="fa3"),
            dict(ours, tag="sweep", fi_error="RuntimeError: no kernel image"),
            dict(ours, tag="fold_off"),
            dict(ours, tag="sweep", fi_us=400.0, fi_of_roofline=0.124, fi_speedup=0.91, fi_err=0.01, fi_graph=False)]
    path = tmp_path / "t.md"
    mla.write_markdown(_results({"version": "0.7.2.post1", "backend": "fa3"}, rows), path)
    decode = path.read_text().split("## Decode")[1]
    table = [line for line in decode.splitlines() if line.startswith("| ")]
    assert table[0].endswith("| FlashInfer µs | FI of roofline | ours µs / FI µs | FI err |")
    assert table[1].endswith("| 364.0 | 49.6 | 0.136 | 0.14 | 10.0 | memory | True | 8 | 64x32 w8 s2 | 91.0 | 0.545 "
                             "| 4.0 | 0.012 |")
    assert table[2].endswith("| error: RuntimeError: no kernel image | | | |") and table[3].endswith("| — | | | |")
    assert table[4].endswith("| 400.0 (eager) | 0.124 | 0.91 | 0.01 |")
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "FlashInfer 0.7.2.post1 MLA decode (backend fa3)" in path.read_text()
    mla.write_markdown(_results({"why": "ModuleNotFoundError: No module named 'flashinfer'"}, rows[2:3]), path)
    text = path.read_text()
    assert "FlashInfer: not measured here (ModuleNotFoundError" in text and text.count("| n/a (above) | | | |") == 1
    assert "FlashInfer µs" in text
    mla.write_markdown(_results(None, rows[2:]), path)  # without --flashinfer: the table as before
    assert "FlashInfer" not in path.read_text()
