"""Pure ASGI middleware: request context (id, access log, HTTP metrics), request-body size limit
and one-line start-up failures.

:class:`RequestContextMiddleware` (outermost) gives each request an id — the client's
``X-Request-ID`` when it is 1–128 safe characters, else a new one — echoes it in the response's
``X-Request-ID``, makes it visible to every log record of the request
(:data:`bayesgate.service.logs.REQUEST_ID`), counts and times the request in Prometheus by route
template — before the answer's last byte is sent, so a client that has read its answer finds it
counted — and writes one JSON access-log line (``bayesgate.access``; health, readiness and
metrics probes at DEBUG so they do not flood the log). Query strings and headers are never
logged. A client that hangs up before its body is read (Starlette's ``ClientDisconnect``) is
logged and counted as 499, with no traceback: there is nobody to answer.

:class:`BodyLimitMiddleware` answers 413 before reading a body whose ``Content-Length`` is too
large, and stops a chunked body as soon as it grows past the limit (``PayloadTooLarge`` is raised
from ``receive`` inside the route, so the app's error handlers map it).

:class:`StartupMessageMiddleware` replaces the traceback Starlette puts in a
``lifespan.startup.failed`` message by the :class:`~bayesgate.service.errors.StartupError` text, so
a
server that cannot load its model logs one line naming the file and the problem.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bayesgate.service.errors import (
    BodyTimeout,
    HeadersTooLarge,
    PayloadTooLarge,
    UnsupportedMediaType,
    UnsupportedTransferCoding,
    error_response,
    is_v2_path,
)
from bayesgate.service.logs import REQUEST_ID, accept_request_id
from bayesgate.service.metrics import Metrics

access_log = logging.getLogger("bayesgate.access")

UNMATCHED = "unmatched"
CLIENT_CLOSED = 499  # nginx's code for "the client closed the connection first"
ARRIVED = "bayesgate.arrived"  # scope key: time.monotonic() when the request reached the app
QUIET_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})


class RouteTemplates:
    """Path → the template of the route it matches (``/v1/models/x`` → ``/v1/models/{name}``).

    Matched here from the route list rather than read from the scope, so it is the same whether
    or not the router ran (a 413 is answered before routing) and whatever the framework version.
    """

    def __init__(self, templates: list[str], cache_size: int = 1024) -> None:
        self._patterns = [(compile_path(t)[0], t) for t in dict.fromkeys(templates)]
        self._seen: dict[str, str] = {}  # path → template, for the paths served most
        self._cache_size = cache_size

    def __call__(self, path: str) -> str:
        template = self._seen.get(path)
        if template is None:
            template = self._match(path)
            if len(self._seen) >= self._cache_size:
                self._seen.clear()  # bounded: arbitrary paths cannot grow it
            self._seen[path] = template
        return template

    def _match(self, path: str) -> str:
        for regex, template in self._patterns:
            if regex.match(path):
                return template
        return UNMATCHED


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        templates: list[str],
        metrics: Metrics | None,
        access_log: bool = True,
        state: Any = None,
    ) -> None:
        self.app = app
        self.state = state  # app.state: ``draining`` adds Connection: close to every response
        self.route_of = RouteTemplates(templates)
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        scope[ARRIVED] = time.monotonic()  # the request deadline counts from here
        offered = None
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                offered = value.decode("latin-1")
                break
        request_id = accept_request_id(offered)
        token = REQUEST_ID.set(request_id)
        route = self.route_of(scope.get("path", ""))  # metrics and the access log
        status = 500
        sent = 0
        counted = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, sent, counted
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                if getattr(self.state, "draining", False):
                    headers = [h for h in headers if h[0].lower() != b"connection"]
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                if not message.get("more_body", False) and not counted:
                    # Counted before the last byte goes out, so a client that has read its
                    # answer finds it in /metrics (the native front end does the same).
                    counted = True
                    self._count(scope, route, status, time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:
            # The client hung up while sending its body (an aborted upload): nobody is left to
            # answer, so this is neither a 500 nor a traceback — a 499 in the log and metrics.
            status = CLIENT_CLOSED
        except asyncio.CancelledError:
            status = CLIENT_CLOSED  # the client went away before the answer
            raise
        except BaseException:
            status = 500
            raise
        finally:
            seconds = time.perf_counter() - start
            self._log(scope, route, status, sent, seconds)
            if not counted:  # no complete answer went out (499, 500, a cancelled request):
                self._count(scope, route, status, seconds)  # logged first: a counted one is logged
            REQUEST_ID.reset(token)

    def _count(self, scope: Scope, route: str, status: int, seconds: float) -> None:
        """Prometheus request counter and latency by route template (once per request)."""
        if self.metrics is not None:
            self.metrics.observe_http(scope.get("method", ""), route, status, seconds)

    def _log(self, scope: Scope, route: str, status: int, sent: int, seconds: float) -> None:
        """One access-log line, after the answer went out (probes at DEBUG)."""
        method = scope.get("method", "")
        if not self.access_log:
            return
        level = logging.DEBUG if route in QUIET_ROUTES and status < 400 else logging.INFO
        if not access_log.isEnabledFor(level):
            return
        client = scope.get("client")
        path = scope.get("path", "")  # as sent in the JSON fields (JSON escapes it)
        fields = {
            "method": method,
            "path": path,
            "route": route,
            "status": status,
            "duration_ms": round(seconds * 1000, 3),
            "bytes_sent": sent,
            "client": f"{client[0]}:{client[1]}" if client else None,
        }
        message = (printable(method), printable(path), status)  # one line in a text log too
        access_log.log(level, "%s %s %d", *message, extra={"fields": fields})


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1, line separators


def printable(text: str) -> str:
    """``text`` with control and line-separator characters as ``\\xNN`` / ``\\uNNNN``: a decoded
    path (``/x%0aINFO: forged``, ``%c2%85``, ``%e2%80%a8``) must not start a line of its own in
    a text log."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def arrived_at(scope: Scope) -> float:
    """``time.monotonic()`` when the request reached the app (now if no middleware stamped it)."""
    return scope.get(ARRIVED, time.monotonic())


def header_list(headers: Any, field: bytes) -> list[str]:
    """The items of a comma-separated header ``field`` (lower-case bytes) over all its copies,
    lower case, empty items dropped."""
    return [
        item.strip().lower()
        for name, value in headers
        if name.lower() == field
        for item in value.decode("latin-1").split(",")
        if item.strip()
    ]


def transfer_coding_error(headers: Any) -> UnsupportedTransferCoding | None:
    """501 for a ``Transfer-Encoding`` with a coding other than ``chunked`` (``gzip, chunked``):
    the HTTP parser undoes only the chunking, so the body would reach the routes still
    compressed and be judged as bad JSON or a bad tensor."""
    codings = header_list(headers, b"transfer-encoding")
    other = [c for c in codings if c != "chunked"]
    if not other:
        return None
    return UnsupportedTransferCoding(
        f"Transfer-Encoding {', '.join(codings)} is not supported: only chunked; send the "
        "body uncompressed"
    )


BODY_METHODS = ("POST", "PUT", "PATCH")


def body_coding_error(
    method: str, headers: Any
) -> UnsupportedTransferCoding | UnsupportedMediaType | None:
    """The coding checks of a request that carries a body (:func:`transfer_coding_error`, then
    :func:`content_encoding_error`); a GET or HEAD costs one comparison, not two header walks."""
    if method not in BODY_METHODS:
        return None
    return transfer_coding_error(headers) or content_encoding_error(method, headers)


def content_encoding_error(method: str, headers: Any) -> UnsupportedMediaType | None:
    """415 for a compressed request body (``Content-Encoding`` other than ``identity``): the
    service reads bodies as sent, and a gzip body would otherwise be judged as JSON, a tensor
    header or a form and refused with a message about its bytes (tritonclient's
    ``request_compression_algorithm="gzip"``, curl with a gzipped file)."""
    if method not in BODY_METHODS:
        return None
    codings = header_list(headers, b"content-encoding")
    if all(c == "identity" for c in codings):
        return None
    return UnsupportedMediaType(
        f"Content-Encoding {', '.join(codings)} is not supported: send the body uncompressed"
    )


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        max_header_count: int | None = None,
        body_read_timeout_s: float | None = None,
        max_header_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_count = max_header_count
        self.max_header_bytes = max_header_bytes
        self.body_read_timeout_s = body_read_timeout_s

    def _error(self, size: str) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body of {size} bytes exceeds the limit of {self.max_body_bytes} bytes "
            "(BAYESGATE_MAX_BODY_BYTES)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        v2 = is_v2_path(scope.get("path", ""))
        headers = scope.get("headers", ())
        error = self._check_headers(headers)
        if error is not None:
            await error_response(error, v2=v2)(scope, receive, send)
            return
        coded = body_coding_error(scope.get("method", ""), headers)
        if coded is not None:
            await error_response(coded, v2=v2)(scope, receive, send)
            return
        length = dict(headers).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await error_response(self._error(length.decode()), v2=v2)(scope, receive, send)
            return
        seen = 0
        body_done = False

        async def limited_receive() -> Message:
            nonlocal seen, body_done
            message = await self._next_piece(receive, body_done)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if seen > self.max_body_bytes:
                    raise self._error(f"more than {self.max_body_bytes}")
            return message

        await self.app(scope, limited_receive, send)

    def _check_headers(self, headers: Any) -> HeadersTooLarge | None:
        """More headers than ``max_header_count``, or more header bytes than ``max_header_bytes``
        (h11 enforces its limit only on a head that arrives in pieces)."""
        if self.max_header_count is not None and len(headers) > self.max_header_count:
            return HeadersTooLarge(
                f"{len(headers)} request headers, at most {self.max_header_count} allowed "
                "(BAYESGATE_MAX_HEADER_COUNT)"
            )
        size = sum(len(name) + len(value) for name, value in headers)
        if self.max_header_bytes is not None and size > self.max_header_bytes:
            return HeadersTooLarge(
                f"request headers of {size} bytes, at most {self.max_header_bytes} allowed "
                "(BAYESGATE_MAX_HEADER_BYTES)"
            )
        return None

    async def _next_piece(self, receive: Receive, body_done: bool) -> Message:
        """The next message; while the body is incomplete, at most ``body_read_timeout_s`` away
        (a client announcing more than it sends — slowloris — gets 408). Once the body is complete
        the next message is the disconnect, awaited without a limit."""
        if body_done or self.body_read_timeout_s is None:
            return await receive()
        try:
            async with asyncio.timeout(self.body_read_timeout_s):  # no task per message
                return await receive()
        except TimeoutError:
            raise BodyTimeout(
                f"the request body stopped arriving for {self.body_read_timeout_s:g} s "
                "(BAYESGATE_BODY_READ_TIMEOUT_S)"
            ) from None


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
