"""`lightspeed serve --speculative-config '{...}'`: the flag comes from EngineConfig, errors name it."""

import pytest
from lightspeed import EngineConfig
from lightspeed_gateway.cli.args import engine_config_from_args


def test_speculative_config_flag_parses_json():
    config = engine_config_from_args(EngineConfig, {"speculative_config": '{"method": "suffix", '
                                                    '"num_speculative_tokens": 5}'}, None)
    assert config.speculative_config.method == "suffix" and config.speculative_config.num_speculative_tokens == 5


def test_bad_speculative_config_names_the_flag():
    with pytest.raises(ValueError, match=r"--speculative-config .*unknown method 'lookahead'"):
        engine_config_from_args(EngineConfig, {"speculative_config": '{"method": "lookahead", '
                                               '"num_speculative_tokens": 2}'}, None)
