"""The HTTP server: FastAPI app, engine adapter, metrics, health."""
