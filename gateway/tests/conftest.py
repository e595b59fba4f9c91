"""Fixtures of the gateway tests (helpers live in gateway_testing.py, a name no other package uses)."""

import pytest
from gateway_testing import start_server, stop_cleanly


@pytest.fixture(scope="module")
def server():
    """The default server of a test module (modules needing other flags start their own)."""
    proc = start_server()
    yield proc
    stop_cleanly(proc)


@pytest.fixture(scope="module")
def base_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def compat_server():
    """A server started with vLLM's habits (aliases, accepted no-op flags, several served names),
    request and stats logging on, one sequence at a time (so queueing order is observable).
    Shared by the vLLM-compatibility, observability and chat modules."""
    proc = start_server(["--max-num-seqs", "1", "--served-model-name", "SmolLM2-135M-Instruct", "smol",
                         "--enable-log-requests", "--log-stats-interval-s", "1", "--enable-prefix-caching",
                         "--enable-auto-tool-choice", "--trust-remote-code"])
    yield proc
    stop_cleanly(proc)
