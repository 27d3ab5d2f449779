"""Pure ASGI middleware: request-body size limit and one-line start-up failures.

:class:`BodyLimitMiddleware` answers 413 before reading a body whose ``Content-Length`` is too
large, and stops a chunked body as soon as it grows past the limit (``PayloadTooLarge`` is raised
from ``receive`` inside the route, so the app's error handlers map it).

:class:`StartupMessageMiddleware` replaces the traceback Starlette puts in a
``lifespan.startup.failed`` message by the :class:`~service.errors.StartupError` text, so a
server that cannot load its model logs one line naming the file and the problem.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import PayloadTooLarge, error_response


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _error(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body of {size} bytes exceeds the limit of {self.max_body_bytes} bytes "
            "(BAYESGATE_MAX_BODY_BYTES)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await error_response(self._error(length.decode()))(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise self._error(f"more than {self.max_body_bytes}")
            return message

        await self.app(scope, limited_receive, send)


class StartupMessageMiddleware:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app.state; lifespan stores ``startup_error`` there

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def clean_send(message: Message) -> None:
            error = getattr(self.state, "startup_error", None)
            if message["type"] == "lifespan.startup.failed" and error:
                message = {**message, "message": f"cannot serve the model: {error}"}
            await send(message)

        await self.app(scope, receive, clean_send)
