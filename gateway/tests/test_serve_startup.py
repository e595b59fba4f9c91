"""`lightspeed serve` as a new user or a vLLM user starts it: vLLM's flag spellings, help written for
users, one-line errors (exit status 2, no traceback) for every start-up mistake, dummy models that
serve text out of the box. Every check runs the CLI as a subprocess."""

import json
import re
import subprocess
import sys

import openai
import pytest
from gateway_testing import requires_real_engine, start_server, stop_cleanly
from lightspeed import default_model
from lightspeed_gateway.cli import build_parser
from lightspeed_gateway.cli.serve import build_configs

LIGHTSPEED = [sys.executable, "-m", "lightspeed_gateway"]


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([*LIGHTSPEED, *args], capture_output=True, text=True, timeout=timeout)


def test_version():
    out = _run("--version")
    assert out.returncode == 0 and out.stdout.startswith("lightspeed 0.1.0 (engine ")


def test_help_is_written_for_users():
    text = _run("serve", "--help").stdout
    assert "Immutable" not in text and "__post_init__" not in text
    assert text.startswith("usage: lightspeed serve [MODEL] [options]")
    assert "{hermes,llama3_json}" in text or "{llama3_json,hermes}" in text  # the choices, not only in an error
    assert "--enable-prefix-caching" in text and "--trust-remote-code" in text


def test_vllm_spellings_set_the_same_fields():
    args = build_parser().parse_args(["serve", "--enable-prefix-caching", "--block-size", "32",
                                      "--kv-cache-memory-bytes", "1GiB", "--uvicorn-log-level", "warning",
                                      "--enable-log-requests", "--disable-log-stats", "-tp", "1",
                                      "--served-model-name", "a", "b", "-q", "fp8"])
    server, engine = build_configs(args)
    assert engine.enable_prefix_cache is True and engine.page_size == 32 and engine.kv_cache_memory == 2**30
    assert server.log_level == "warning" and server.log_requests and server.log_stats_interval_s == 0
    assert server.served_model_name == ("a", "b") and engine.tensor_parallel_size == 1
    assert engine.quantization == "fp8"
    off = build_configs(build_parser().parse_args(["serve", "--no-enable-prefix-caching"]))[1]
    assert off.enable_prefix_cache is False


@pytest.mark.parametrize("argv,needle", [
    (["--max-modle-len", "512"], "unrecognized arguments: --max-modle-len (did you mean --max-model-len?)"),
    (["--quantization", "awq"], "argument --quantization/-q: invalid choice: 'awq'"),
    (["--speculative-config", "{}"], "--speculative-config {}: speculative_config needs 'method'"),
])
def test_flag_mistakes_are_one_clear_error(argv, needle):
    out = _run("serve", *argv)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr
    if "unrecognized" in needle:
        assert out.stderr.startswith("usage: lightspeed serve")  # the subcommand's usage, not the top level's


def _config_only_folder(tmp_path, vocab_size: int) -> str:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab_size,
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256, "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_start_up_mistakes_are_one_line_each():
    """One case per way a start-up error travels: found before the engine core starts, reported by
    the core, found once the core is ready (the engine tests cover each kind of mistake)."""
    cases = [
        (["--trust-remote-code", "/no/such/model"], "model path '/no/such/model' does not exist"),
        (["tiny-llama", "--load-format", "dummy", "--kv-cache-memory", "64KiB", "--max-model-len", "512"],
         "cannot hold one sequence of max_model_len=512"),
        (["tiny-llama", "--load-format", "dummy", "--tokenizer", default_model()],
         "has 49152 tokens but the model's vocabulary has 256"),
    ]
    procs = [subprocess.Popen([*LIGHTSPEED, "serve", "--num-threads", "1", *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv, _ in cases]  # side by side
    for (argv, needle), proc in zip(cases, procs, strict=True):
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 2, (argv, err)
        assert needle in err and "Traceback" not in err, (argv, err)
        # The engine core's own log lines (timestamped INFO / WARNING) may come before the error.
        lines = [line for line in err.splitlines() if not re.match(r"\d{4}-\d\d-\d\d .* (INFO|WARNING) ", line)]
        assert lines[-1].startswith("lightspeed serve: error:"), (argv, err)
        if "--trust-remote-code" in argv:  # one warning line, then the error
            assert len(lines) == 2 and lines[0].startswith("lightspeed serve: warning: --trust-remote-code has no "
                                                           "effect here"), err
        else:
            assert len(lines) == 1, (argv, err)


@requires_real_engine
@pytest.mark.parametrize("which", ["preset", "config-only folder"])
def test_dummy_models_serve_text_out_of_the_box(which, tmp_path):
    model = "tiny-llama"
    if which != "preset":
        (tmp_path / "m").mkdir()
        model = _config_only_folder(tmp_path / "m", 320)
    server = start_server([model, "--load-format", "dummy", "--max-model-len", "256"])
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        name = client.models.list().data[0].id
        assert name == ("tiny-llama" if which == "preset" else "m")
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=5, temperature=0, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 5 and isinstance(reply.choices[0].message.content, str)
    finally:
        stop_cleanly(server)
