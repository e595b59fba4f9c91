"""Pure-ASGI middleware: API-key check (on /v1 routes, or with guard_all_routes on every route but
/health) and the request-body size limit.

Both run before FastAPI parses the body, so a 401 or 413 costs nothing, and neither buffers
streaming responses (Starlette's BaseHTTPMiddleware would). The key comes as `Authorization:
Bearer KEY` (OpenAI) or `x-api-key: KEY` (Anthropic). `error_shapes` maps a path prefix to the
function that renders errors in that API's own shape (default: OpenAI's).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi.responses import JSONResponse

from lightspeed_gateway.openai.errors import APIError, too_large, unauthorized


class GuardMiddleware:
    def __init__(self, app, api_key: str | None, max_body_bytes: int,
                 error_shapes: dict[str, Callable[[APIError], JSONResponse]] | None = None,
                 guard_all_routes: bool = False) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.error_shapes = error_shapes or {}
        self.guard_all_routes = guard_all_routes

    def _guarded(self, path: str) -> bool:
        if self.api_key is None:
            return False
        return path.startswith("/v1") or (self.guard_all_routes and path != "/health")

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        bearer_ok = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)
        key_ok = hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.api_key)
        return bearer_ok or key_ok

    async def _send_error(self, scope, send, error: APIError) -> None:
        shape = next((f for prefix, f in self.error_shapes.items() if scope["path"].startswith(prefix)), None)
        response = shape(error) if shape is not None else error.response()
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "http.response.body", "body": response.body})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self._guarded(scope["path"]) and not self._authorized(headers):
            await self._send_error(scope, send, unauthorized())
            return
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._send_error(scope, send, too_large(self.max_body_bytes))
            return
        if length is None and scope["method"] in ("POST", "PUT", "PATCH"):
            # Chunked upload: read it here, up to the limit, then replay it to the app.
            body, more = [], True
            size = 0
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # client went away
                body.append(message.get("body", b""))
                size += len(body[-1])
                more = message.get("more_body", False)
                if size > self.max_body_bytes:
                    await self._send_error(scope, send, too_large(self.max_body_bytes))
                    return
            replay = [{"type": "http.request", "body": b"".join(body), "more_body": False}]

            async def replay_receive():
                return replay.pop() if replay else await receive()

            await self.app(scope, replay_receive, send)
            return
        await self.app(scope, receive, send)

