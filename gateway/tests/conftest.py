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
