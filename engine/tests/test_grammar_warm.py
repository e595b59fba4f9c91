"""The grammar worker's warm-up: the tokenizer and xgrammar's compiler are built before the first
constrained request (on the H200 that request waited 13.3 s for them, the next 0.3 s), and a
tokenizer that cannot load stays silent until a request needs it, which then gets the clear error."""

from __future__ import annotations

import logging

import pytest
from lightspeed.config import EngineConfig
from lightspeed.runner.structured import GrammarCompiler


@pytest.fixture(scope="module")
def smol_tokenizer(default_model_path):
    from lightspeed.frontend.tokenizer import load_engine_tokenizer

    return load_engine_tokenizer(EngineConfig(model=default_model_path), 49152)


def test_warm_builds_the_compiler_once_before_any_request(smol_tokenizer):
    loads = []

    def load():
        loads.append(1)
        return smol_tokenizer

    compiler = GrammarCompiler(load, 49152, cache_size=4)
    compiler.warm().result(timeout=120)
    assert loads == [1] and compiler._compiler is not None
    compiler.submit("json_object", "").result(timeout=60)
    compiler.submit("regex", "[ab]+").result(timeout=60)
    assert loads == [1]  # the requests found it built
    compiler.shutdown()


def test_a_tokenizer_that_fails_stays_quiet_until_a_request_needs_it(caplog):
    def load():
        raise OSError("no tokenizer files in this folder")

    compiler = GrammarCompiler(load, 49152, cache_size=4)
    with caplog.at_level(logging.ERROR, logger="lightspeed.runner"):
        assert compiler.warm().result(timeout=60) is None
    assert not caplog.records
    with pytest.raises(ValueError, match="tokenizer did not load"):
        compiler.submit("json_object", "").result(timeout=60)
    assert any("cannot load the tokenizer" in r.getMessage() for r in caplog.records)
    compiler.shutdown()
