"""`lightspeed` CLI: generated flags, configs, env, bench forwarding, serve start-up and clean shutdown."""

import dataclasses
import signal
import subprocess
import sys
import time

import httpx
import pytest
from gateway_testing import pid_alive, requires_real_engine, start_server
from lightspeed import EngineConfig
from lightspeed_gateway.cli import build_parser, main
from lightspeed_gateway.cli.serve import build_configs
from lightspeed_gateway.config import ServerConfig

VLLM_FLAGS = ["--host", "--port", "--api-key", "--served-model-name", "--max-model-len", "--max-num-seqs",
              "--max-num-batched-tokens", "--gpu-memory-utilization", "--kv-cache-dtype", "--dtype", "--load-format",
              "--tensor-parallel-size", "--tool-call-parser", "--reasoning-parser", "--chat-template", "--seed",
              "--log-level", "--max-request-body-bytes", "--max-waiting-requests", "--data-parallel-size",
              "--enable-expert-parallel", "--nnodes", "--node-rank", "--master-addr", "--master-port"]


def _help() -> str:
    out = subprocess.run([sys.executable, "-m", "lightspeed_gateway", "serve", "--help"], capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_help_lists_every_config_field_once():
    text = _help()
    for flag in VLLM_FLAGS:
        assert flag in text
    for cls in (EngineConfig, ServerConfig):
        for field in dataclasses.fields(cls):
            if field.name == "model":
                continue
            flag = "--" + field.name.replace("_", "-")
            assert text.count(flag + " ") + text.count(flag + "\n") + text.count(flag + ",") >= 1, flag
            assert field.metadata["help"].split()[0] in text


def test_flags_build_typed_configs(monkeypatch):
    monkeypatch.setenv("LIGHTSPEED_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "some.gguf", "--port", "9001", "--max-model-len", "512",
                                      "--kv-cache-memory", "2GiB", "--no-enable-prefix-cache",
                                      "--gpu-memory-utilization", "0.5", "--reasoning-parser", "think"])
    server, engine = build_configs(args)
    assert server.port == 9001 and server.api_key == "from-env" and server.reasoning_parser == "think"
    assert server.host == "127.0.0.1"
    assert engine.model == "some.gguf" and engine.max_model_len == 512
    assert engine.kv_cache_memory == 2 * 2**30 and engine.enable_prefix_cache is False
    assert engine.gpu_memory_utilization == 0.5
    args = build_parser().parse_args(["serve", "--api-key", "flag"])
    assert build_configs(args)[0].api_key == "flag"


def test_bad_flag_values_are_clear_errors(capsys):
    assert main(["serve", "--max-num-seqs", "zero"]) == 2
    assert "--max-num-seqs zero" in capsys.readouterr().err
    assert main(["serve", "--port", "99999"]) == 2
    assert "port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--tool-call-parser", "nope"])


def test_env_reports_versions_devices_kernels(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for needle in ("lightspeed-gateway", "torch", "devices:", "cores", "attention/decode", "->"):
        assert needle in out


def test_bench_forwards_to_lightspeed_bench(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "agentic", "--help"])
    assert exit_info.value.code == 0
    assert "agentic" in capsys.readouterr().out


def test_serve_ready_chat_and_sigint_leaves_no_orphan():
    server = start_server()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert "serving" in server.output() and "/v1" in server.output()
        assert httpx.get(server.url + "/health").status_code == 200
        engines = server.engine_pids
        assert engines, "the engine core runs as a child process"
        chat = subprocess.run([sys.executable, "-m", "lightspeed_gateway", "chat", "--url", server.url,
                               "--max-tokens", "8", "--temperature", "0"], input="Hello\n/exit\n",
                              capture_output=True, text=True, timeout=120)
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout.count("> ") >= 2 and len(chat.stdout.splitlines()) >= 3
    finally:
        code = server.stop(signal.SIGINT)
    assert code == 0, server.output()[-3000:]
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in engines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(p) for p in engines)


@requires_real_engine
def test_chat_in_process_engine():
    chat = subprocess.run([sys.executable, "-m", "lightspeed_gateway", "chat", "--max-tokens", "4",
                           "--temperature", "0", "--system", "Be brief."], input="Hello\n/reset\nHi\n/exit\n",
                          capture_output=True, text=True, timeout=300)
    assert chat.returncode == 0, chat.stderr[-3000:]
    assert "in-process" in chat.stdout
    replies = [line for line in chat.stdout.splitlines() if line.startswith("> ") and len(line) > 2]
    assert len(replies) >= 2, chat.stdout  # the prompt marker, then the streamed reply on the same line
