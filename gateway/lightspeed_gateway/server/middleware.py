"""Pure-ASGI middleware: API-key check on /v1 routes and the request-body size limit.

Both run before FastAPI parses the body, so a 401 or 413 costs nothing, and neither buffers
streaming responses (Starlette's BaseHTTPMiddleware would).
"""

from __future__ import annotations

import hmac

from lightspeed_gateway.openai.errors import APIError, too_large, unauthorized


class GuardMiddleware:
    def __init__(self, app, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"].startswith("/v1"):
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.api_key):
                await _send_error(send, unauthorized())
                return
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await _send_error(send, too_large(self.max_body_bytes))
            return
        limit, seen, sent = self.max_body_bytes, 0, False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge()
            return message

        async def tracked_send(message):
            nonlocal sent
            if message["type"] == "http.response.start":
                sent = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _BodyTooLarge:
            if not sent:
                await _send_error(send, too_large(limit))


class _BodyTooLarge(Exception):
    pass


async def _send_error(send, error: APIError) -> None:
    response = error.response()
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})
