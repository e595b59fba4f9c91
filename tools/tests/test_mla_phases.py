"""tools/bench/mla_phases.py on the CPU: a launch's phase stamps -> the table (medians, max, ramp)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
import mla_phases  # noqa: E402

PHASES = ("entry", "work", "first_tile", "epilogue")
T0 = 1_700_000_000_000_000_000  # a %globaltimer value: ns since the epoch


def _stamps() -> np.ndarray:
    # Three CTAs entering 0, 1 and 4 µs into the launch; the third has no keys (no tile stamp), and a
    # fourth row was never reached (an idle CTA's zeros).
    rel = np.array([[0, 500, 3_000, 20_000], [1_000, 1_500, 5_000, 22_000], [4_000, 4_200, -1, 9_000],
                    [-1, -1, -1, -1]])
    return np.where(rel >= 0, T0 + rel, 0)


def test_phases_from_the_first_entry_median_max_and_per_cta():
    s = mla_phases.summarise(_stamps(), phases=PHASES)
    assert s["ctas"] == 3 and s["ramp_us"] == 4.0 and s["entry_median_us"] == 1.0
    assert s["span_us"] == 22.0 and s["resolution_ns"] == 200
    assert s["phases"]["entry"] == {"ctas": 3, "median_us": 1.0, "max_us": 4.0, "cta_median_us": 0.0}
    assert s["phases"]["first_tile"] == {"ctas": 2, "median_us": 4.0, "max_us": 5.0, "cta_median_us": 3.5}
    assert s["phases"]["epilogue"] == {"ctas": 3, "median_us": 20.0, "max_us": 22.0, "cta_median_us": 20.0}
    assert "wall_us" not in s


def test_the_stream_marks_give_launch_and_drain_gaps():
    s = mla_phases.summarise(_stamps(), before_ns=T0 - 3_500, after_ns=T0 + 24_000, phases=PHASES)
    assert (s["launch_gap_us"], s["drain_gap_us"], s["wall_us"]) == (3.5, 2.0, 27.5)


def test_a_phase_no_cta_reached_is_empty():
    stamps = _stamps()
    stamps[:, 2] = 0
    assert mla_phases.summarise(stamps, phases=PHASES)["phases"]["first_tile"] == {
        "ctas": 0, "median_us": None, "max_us": None, "cta_median_us": None}


def test_reps_are_merged_field_by_field():
    a = mla_phases.summarise(_stamps(), phases=PHASES)
    later = _stamps()
    later[:, 3] = np.where(later[:, 3] > 0, later[:, 3] + 4_000, 0)  # every epilogue 4 µs later
    b = mla_phases.summarise(later, phases=PHASES)
    m = mla_phases.median_summary([a, b, dict(a, resolution_ns=None)])
    assert m["phases"]["epilogue"]["median_us"] == 20.0 and m["ctas"] == 3 and isinstance(m["ctas"], int)
    assert m["resolution_ns"] == 200  # a launch without the field is left out
    assert mla_phases.median_summary([a, b])["phases"]["epilogue"]["max_us"] == 24.0  # (22 + 26) / 2


def test_markdown_has_a_table_per_point_and_kind(tmp_path):
    s = mla_phases.summarise(_stamps(), before_ns=T0 - 3_500, after_ns=T0 + 24_000, phases=PHASES)
    row = {"point": "cta_1tile", "kind": "bf16", "batch": 132, "heads": 16, "q_len": 4, "ctx": 64, "splits": 1,
           "row_tiles": 1, "summary": s}
    result = {"device": "NVIDIA H200", "commit": "abc", "torch": "2.11", "build_s": 30.0, "reps": 5, "rows": [row]}
    path = tmp_path / "t.md"
    mla_phases.write_markdown(result, path)
    text = path.read_text()
    assert "## cta_1tile: bf16, batch 132" in text and "entry ramp 4.0 µs" in text and "launch gap 3.5" in text
    assert "| first_tile | 2 | 4.0 | 5.0 | 3.5 |" in text


def test_every_kind_names_a_cache_kind_and_known_run_flags():
    import inspect

    from lightspeed_mla import sm90

    flags = set(inspect.signature(sm90.launch).parameters)
    for kind, (cache_kind, kw) in mla_phases.KINDS.items():
        assert cache_kind in sm90.CACHE_KINDS and set(kw) <= flags, kind
    assert mla_phases.KINDS["fp8mma"][1] == {"fp8_scores": True, "fp8_pv": True}


def test_an_unknown_kind_is_refused_before_any_build(capsys):
    import pytest

    with pytest.raises(SystemExit):
        mla_phases.main(["--out", "/tmp/unused", "--kinds", "bf16,fp4"])
    assert "unknown kinds ['fp4']" in capsys.readouterr().err


def test_counters_turn_each_ctas_cycles_into_its_share_of_its_time():
    # Two CTAs that ran tiles, at 2 GHz and 1 GHz (entry to epilogue 20 µs: 40,000 / 20,000 cycles), one
    # without keys (no first_tile stamp: left out). Counters: consumer_wait_full, producer_wait_empty,
    # clock_entry, clock_epilogue.
    phases, counters = ("entry", "first_tile", "epilogue"), ("consumer_wait_full", "producer_wait_empty",
                                                            "clock_entry", "clock_epilogue")
    raw = np.array([[T0, T0 + 3_000, T0 + 20_000, 10_000, 4_000, 100, 40_100],
                    [T0, T0 + 3_000, T0 + 20_000, 5_000, 0, 7, 20_007],
                    [T0, 0, T0 + 9_000, 0, 0, 0, 18_000]])
    c = mla_phases.summarise_counters(raw, phases=phases, counters=counters)
    assert c["ghz"] == 1.333  # 1 / the median of the CTAs' 0.5 and 1.0 ns a cycle
    assert c["consumer_wait_full"] == {"median_us": 5.0, "share": 0.25}  # 5 µs of 20 in both CTAs
    assert c["producer_wait_empty"] == {"median_us": 1.0, "share": 0.05}  # 2 µs and 0 µs
    assert "clock_entry" not in c and mla_phases.summarise_counters(raw[2:], phases=phases, counters=counters) == {}
