"""The progress line without tqdm, and silence when disabled."""

import sys

from lightspeed_bench.progress import Progress


def test_plain_stderr_line_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    bar = Progress(enabled=True)
    bar.start_level("c=2", total=3)
    for ok in (True, False, True):
        bar.update(ok)
    bar.close()
    err = capsys.readouterr().err
    assert "c=2: 0/3 requests, 0 errors" in err
    assert err.rstrip().endswith("c=2: 3/3 requests, 1 errors")


def test_disabled_prints_nothing(capsys):
    bar = Progress(enabled=False)
    bar.note("preparing")
    bar.start_level("c=1", total=1)
    bar.update(True)
    bar.close()
    assert capsys.readouterr().err == ""
