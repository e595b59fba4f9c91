"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error to send back as is; raised anywhere under a handler."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", "invalid_request_error", "model", "model_not_found")


def engine_unavailable(retry_after_s: int) -> APIError:
    return APIError(503, "The engine is not running; try again later.", "service_unavailable", None,
                    "engine_unavailable", {"Retry-After": str(retry_after_s)})


def overloaded(retry_after_s: int) -> APIError:
    return APIError(429, "Too many requests are waiting; retry later.", "rate_limit_error", None,
                    "too_many_waiting_requests", {"Retry-After": str(retry_after_s)})


def unauthorized() -> APIError:
    return APIError(401, "Invalid or missing API key.", "authentication_error", None, "invalid_api_key",
                    {"WWW-Authenticate": "Bearer"})


def too_large(limit: int) -> APIError:
    return APIError(413, f"Request body is larger than {limit} bytes.", "invalid_request_error", None,
                    "request_too_large")


ERROR_RESPONSES = {
    400: {"model": None, "description": "Invalid request"},
    401: {"description": "Invalid or missing API key"},
    404: {"description": "Unknown model"},
    413: {"description": "Request body too large"},
    429: {"description": "Too many waiting requests (Retry-After)"},
    503: {"description": "Engine not running (Retry-After)"},
}
