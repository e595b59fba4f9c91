"""tools/bench/api_check.py against a real `lightspeed serve` of a DeepSeek-V3-shaped dummy (MLA + MoE,
random weights, SmolLM2's tokenizer): every check passes, which is what the H200 run of the DeepSeek
issue relies on, and the checker reports an unreachable server as failures, not a traceback."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import api_check  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def deepseek_server(tmp_path_factory):
    from lightspeed.model_files import default_model
    from lightspeed.models import preset_hf_config

    folder = tmp_path_factory.mktemp("tiny-dsv3")
    config = {**preset_hf_config("tiny-deepseek-v3"), "vocab_size": 49152, "max_position_embeddings": 2048}
    (folder / "config.json").write_text(json.dumps(config))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lightspeed_gateway", "serve", str(folder), "--load-format", "dummy",
                             "--tokenizer", default_model(), "--port", str(port), "--max-model-len", "1024"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_every_check_passes_on_a_deepseek_shaped_dummy(deepseek_server, tmp_path):
    out = tmp_path / "api.json"
    assert api_check.main(["--base-url", deepseek_server, "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["check"] for r in results] == [c.__name__[len("check_"):] for c in api_check.CHECKS]
    assert all(r["ok"] for r in results), results


def test_an_unreachable_server_fails_every_check(capsys):
    assert api_check.main(["--base-url", f"http://127.0.0.1:{_free_port()}", "--timeout", "2"]) == len(api_check.CHECKS)
    assert "cannot list the models" in capsys.readouterr().err
