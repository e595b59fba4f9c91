"""The OpenAI client suite of test_openai_client.py against `lightspeed serve --tensor-parallel-size 2`
(SmolLM2 on CPU: its 9 query / 3 KV heads split 6 + 3 / 2 + 1 over two gloo ranks)."""

import functools

import pytest
import test_openai_client as suite
from gateway_testing import ENGINE_KIND, child_pids, pid_alive, start_server, stop_cleanly
from test_openai_client import *  # noqa: F403  (the same tests, collected again over this module's server)

pytestmark = pytest.mark.skipif(ENGINE_KIND != "real", reason="tensor parallelism needs the real engine")


def _slow(test):
    """A copy of `test` marked slow: grammar compilation dominates it, and it runs on rank 0 only."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return test(*args, **kwargs)

    return pytest.mark.slow(run)


test_tool_choice_named_and_required = _slow(suite.test_tool_choice_named_and_required)
test_response_format_json_schema_validates = _slow(suite.test_response_format_json_schema_validates)


@pytest.fixture(scope="module")
def server():
    proc = start_server(["--tensor-parallel-size", "2"])
    ranks = [pid for core in proc.engine_pids for pid in child_pids(core)]
    assert ranks, "the engine core started its second rank"
    yield proc
    stop_cleanly(proc)
    assert not any(pid_alive(pid) for pid in ranks), "orphaned rank process"
