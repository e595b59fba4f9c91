"""Plot labels: overlaid runs stay apart; 'per GPU' only where the server ran on a GPU."""

from lightspeed_bench.plot import run_labels, y_label


def _run(label=None, date="2026-12-01T10:00:00+00:00", commit="abc", device=None, model="m", url="http://h"):
    run = {"model": model, "server": {"base_url": url}, "date": date, "git_commit": commit}
    if label is not None:
        run["label"] = label
    if device is not None:
        run["device"] = device
    return run


def test_runs_of_the_same_server_get_distinct_labels():
    runs = [_run(date="2026-12-01T10:00:00+00:00"), _run(date="2026-12-01T11:30:00+00:00"), _run(label="mine")]
    labels = run_labels(runs)
    assert labels == ["m @ http://h (2026-12-01 10:00)", "m @ http://h (2026-12-01 11:30)", "mine"]
    same_date = run_labels([_run(commit="aaa"), _run(commit="bbb")])
    assert same_date[0] != same_date[1] and "aaa" in same_date[0]
    twins = run_labels([_run(), _run()])
    assert twins[0] != twins[1]
    assert run_labels([_run(label="a"), _run(label="b")]) == ["a", "b"]  # distinct already: untouched


def test_per_gpu_only_on_gpu_runs():
    assert y_label([_run(device="cpu")], "output") == "output tokens / min"
    assert y_label([_run(device="cuda:0")], "output") == "output tokens / min / GPU"
    assert y_label([_run()], "total").endswith("/ GPU")  # a server that does not say (vLLM): a GPU server
    assert "per GPU for GPU runs" in y_label([_run(device="cpu"), _run(device="cuda:0")], "output")
