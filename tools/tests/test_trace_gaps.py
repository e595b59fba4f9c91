"""trace_gaps.py: busy time is the union of kernel intervals, idle gaps split into kernel-boundary
and host-wait gaps at the threshold, per step."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import trace_gaps  # noqa: E402


def _trace(spans):
    """spans: (name, start us, duration us); plus a CPU event the report must ignore."""
    events = [{"cat": "kernel", "name": n, "ts": t, "dur": d} for n, t, d in spans]
    return {"traceEvents": events + [{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1000}]}


def test_gaps_split_into_boundaries_and_host_waits(tmp_path):
    # two steps: norm -> gemm 0.5 us apart, then a 40 us host wait before the next step's norm
    spans = [("norm", 0, 2), ("gemm", 2.5, 10), ("norm", 52.5, 2), ("gemm", 55.0, 10)]
    report = trace_gaps.gap_report(trace_gaps.kernel_events(_trace(spans)), steps=2)
    assert report["kernels_per_step"] == 2
    assert report["busy_us_per_step"] == pytest.approx(24 / 2)
    assert report["boundary"]["us_per_step"] == pytest.approx(1.0 / 2)
    assert report["host"]["us_per_step"] == pytest.approx(40 / 2)
    assert report["host"]["top_pairs"][0]["before"] == "gemm"
    assert report["span_us_per_step"] == pytest.approx(65 / 2)

    path = tmp_path / "t.json"
    path.write_text(json.dumps(_trace(spans)))
    out = tmp_path / "r.json"
    assert trace_gaps.main([str(path), "--steps", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["host"]["count_per_step"] == 0.5


def test_overlapping_kernels_count_once_and_leave_no_gap():
    # a kernel that starts before the previous one ends (PDL, a second stream) is not idle time
    spans = [("a", 0, 10), ("b", 5, 10), ("c", 16, 4)]
    report = trace_gaps.gap_report(trace_gaps.kernel_events(_trace(spans)), steps=1)
    assert report["busy_us_per_step"] == pytest.approx(19)
    assert report["boundary"]["us_per_step"] == pytest.approx(1)
    assert report["host"]["us_per_step"] == 0


def test_too_little_trace_is_an_error():
    with pytest.raises(ValueError):
        trace_gaps.gap_report([{"name": "a", "ts": 0, "dur": 1}], steps=1)


def _op(cat, name, stream, ts, dur, correlation=None):
    args = {"stream": stream} if correlation is None else {"stream": stream, "correlation": correlation}
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def _launch(name, ts, correlation):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1, "args": {"correlation": correlation}}


def test_a_result_streams_copy_counts_from_the_kernels_launched_before_it_not_those_after():
    """Step N's token copy (stream 17, launched after step N's sampler) waits behind the write-through while the
    compute stream runs step N+1, launched after the copy: the copy could have started when the sampler ended."""
    events = [
        _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 13, 0, 5000),          # write-through
        _launch("cudaLaunchKernel", -50, 1), _op("kernel", "sampler_N", 7, 0, 100, 1),
        _launch("cudaMemcpyAsync", -40, 2), _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 17, 5001, 2, 2),
        *(x for j in range(50) for x in (_launch("cudaLaunchKernel", -30 + j * 0.1, 10 + j),
                                          _op("kernel", f"step_N+1_{j}", 7, 100 + 100 * j, 100, 10 + j))),
    ]
    waits = trace_gaps.copy_waits({"traceEvents": events})
    assert waits[17]["late"] == 1 and waits[17]["late_us_total"] == pytest.approx(4901)


def test_copy_waits_find_a_kernel_streams_copy_queued_behind_another_streams_copy(tmp_path, capsys):
    events = [
        _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 13, 0, 5000),     # the write-through, stream 13
        _op("kernel", "sampler", 7, 0, 100),
        _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 7, 5000, 2),      # waited 4900 us for the engine
        _op("kernel", "next_step", 7, 5003, 100),
        _op("kernel", "sampler", 7, 6000, 100),
        _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 7, 6102, 2),      # on time: nothing else copying
        _op("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 7, 9000, 2),      # late, but no other copy ran
        _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 17, 4000, 2),     # result stream: sampler ended at 100
        _op("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 17, 6100.5, 1),   # right after its sampler: on time
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10},
    ]
    waits = trace_gaps.copy_waits({"traceEvents": events})
    assert waits[7]["copies"] == 3 and waits[7]["late"] == 1
    assert waits[7]["late_us_total"] == pytest.approx(4900)
    assert waits[17]["copies"] == 2 and waits[17]["late"] == 1 and waits[17]["late_us_total"] == pytest.approx(3900)
    assert waits[13] == {"copies": 1, "late": 0, "late_us_total": 0, "late_us_median": 0.0}  # nothing before it
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert trace_gaps.main([str(path), "--steps", "2", "--copy-waits"]) == 0
    assert "stream 7: 3 host copies, 1 queued behind another stream's copy (2450.0 us/step" in capsys.readouterr().out
