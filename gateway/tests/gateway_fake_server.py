"""`lightspeed serve` with the fake engine (tests only): same CLI, same app, scripted model."""

import os
import sys

from gateway_fake_engine import FakeAsyncLLM
from lightspeed_gateway.cli import build_parser
from lightspeed_gateway.cli.serve import build_configs, serve

if __name__ == "__main__":
    args = build_parser().parse_args(["serve", *sys.argv[1:]])
    server_config, engine_config = build_configs(args)
    sys.exit(serve(server_config, engine_config,
                   make_engine=lambda model: FakeAsyncLLM(model, max_model_len=engine_config.max_model_len or 2048,
                                                        max_num_seqs=engine_config.max_num_seqs, token_delay_s=float(os.environ.get("FAKE_TOKEN_DELAY_S", "0.02")))))
