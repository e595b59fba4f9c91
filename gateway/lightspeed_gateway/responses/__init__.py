"""OpenAI Responses API: POST /v1/responses, GET / DELETE /v1/responses/{id}, POST .../cancel,
mounted as `router` (its lifespan opens the bounded response store: memory or SQLite)."""

from lightspeed_gateway.responses.api import router

__all__ = ["router"]
