"""lightspeed-gateway: the OpenAI-compatible HTTP server of Lightspeed and the `lightspeed` command.

Public API: `ServerConfig` (the server's knobs), `build_app(config, make_engine, model_path)` (the
FastAPI app over any AsyncLLM-like engine), `main(argv)` (the `lightspeed` command), and the
streaming parsers (`lightspeed_gateway.parsers`).
"""

from lightspeed_gateway.config import ServerConfig

__version__ = "0.1.0"


def build_app(*args, **kwargs):
    """See `lightspeed_gateway.server.app.build_app` (imported lazily: FastAPI is not needed by the parsers)."""
    from lightspeed_gateway.server.app import build_app as _build_app

    return _build_app(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    from lightspeed_gateway.cli import main as _main

    return _main(argv)


__all__ = ["ServerConfig", "build_app", "main", "__version__"]
