"""Anthropic-shaped errors: `{"type": "error", "error": {"type", "message"}}`, for every failure of the
Messages routes (validation, handler, auth and body-size middleware), so the `anthropic` client
raises the right exception class."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.requests import Request

from lightspeed_gateway.openai.errors import APIError

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def error_response(error: APIError) -> JSONResponse:
    headers = {k: v for k, v in (error.headers or {}).items() if k.lower() != "www-authenticate"}
    return JSONResponse(error_body(error.status, error.message), status_code=error.status, headers=headers or None)


def validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    # A content union fails on every member; the tag error (an unknown block type) says what is wrong.
    first = next((e for e in errors if str(e.get("type", "")).startswith("union_tag")), errors[0])
    if first.get("type") == "json_invalid":
        return "The request body is not valid JSON."
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    return f"{loc}: {message}" if loc else message


class AnthropicRoute(APIRoute):
    """A route whose errors come out in Anthropic's shape (the app's handlers answer OpenAI's)."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()

        async def handle(request: Request):
            try:
                return await handler(request)
            except RequestValidationError as exc:
                error = APIError(400, validation_message(exc))
            except APIError as exc:
                error = exc
            state = getattr(request.app.state, "gateway", None)
            if state is not None:
                state.metrics.errors.labels(state.model_name, str(error.status)).inc()
            return error_response(error)

        return handle
