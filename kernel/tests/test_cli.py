import subprocess
import sys
from pathlib import Path

from lightspeed_kernel.cli import main


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "attention/decode" in out and "reference" in out and "sampling/sample" in out


def test_list_one_family(capsys):
    assert main(["list", "norm"]) == 0
    out = capsys.readouterr().out
    assert "norm/rms" in out and "attention/" not in out


def test_explain_cpu(capsys):
    assert main(["explain", "attention", "decode", "--dtype", "bfloat16", "--platform", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "attention/decode" in out and "selected: reference" in out
    for line in out.splitlines():
        if "triton" in line:  # built-in Triton kernels need a GPU
            assert "rejected" in line


def test_explain_bad_override_exit_code(capsys):
    code = main(["explain", "norm", "rms", "--dtype", "float32", "--platform", "cpu", "--override", "nope"])
    assert code == 1
    assert "error:" in capsys.readouterr().out


def test_console_script():
    script = Path(sys.executable).with_name("lightspeed-kernel")
    result = subprocess.run(
        [str(script), "explain", "norm", "rms", "--dtype", "float16", "--platform", "cpu"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "selected: reference" in result.stdout
