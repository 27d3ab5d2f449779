"""JSON 400s that name what the HTTP parser could not take.

uvicorn answers a request its parser rejects — a bad or duplicate ``Content-Length``, a malformed
request line or header, a ``Transfer-Encoding`` beside a ``Content-Length``, … — before the app
sees it, with a fixed ``400 Invalid HTTP request received.`` in ``text/plain``. The protocols of
``bayesgate serve`` keep the parser's own reason (httptools' llhttp message, h11's
``RemoteProtocolError``) and answer as every other error of the service does, in JSON::

    {"error": "malformed HTTP request: Duplicate Content-Length",
     "detail": "…the same…", "code": "malformed_request"}

with ``connection: close`` (the stream cannot be read past the error). uvicorn still logs its
warning. A head h11 refuses for its size (``h11_max_incomplete_event_size``, its status hint 431)
gets the same JSON 431 ``headers_too_large`` as the httptools protocol's own head bound
(:mod:`~bayesgate.service.httptools_protocol`), so both parsers refuse a head alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import h11
import httptools

from bayesgate.service.errors import error_body
from bayesgate.service.settings import protocol_settings

CODE = "malformed_request"
MAX_REASON = 200  # characters of the parser's message kept (h11 quotes the offending line)
STATUS_LINES = {400: b"HTTP/1.1 400 Bad Request\r\n",
                431: b"HTTP/1.1 431 Request Header Fields Too Large\r\n"}  # fmt: skip
Headers = Sequence[tuple[bytes, bytes]]


def head_limits() -> tuple[int, int]:
    """``(max_header_bytes, max_header_count)`` of the serving process's settings."""
    settings = protocol_settings()
    return settings.max_header_bytes, settings.max_header_count


def refusal(status: int, message: str, code: str, default_headers: Headers = ()) -> bytes:
    """A whole HTTP/1.1 response refusing a request before the app: JSON :func:`error_body`,
    ``connection: close`` (``default_headers``: uvicorn's ``server``/``date``)."""
    body = json.dumps(error_body(message, code)).encode()
    head = [STATUS_LINES[status]]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    head.append(b"connection: close\r\n\r\n")
    return b"".join(head) + body


def too_large_response(message: str, default_headers: Headers = ()) -> bytes:
    """JSON 431 ``headers_too_large``, closed."""
    return refusal(431, message, "headers_too_large", default_headers)


def head_too_large_message() -> str:
    max_bytes, _ = head_limits()
    return f"a request head of more than {max_bytes} bytes (BAYESGATE_MAX_HEADER_BYTES)"


def bad_request_response(reason: str, default_headers: Headers = ()) -> bytes:
    """JSON 400 ``malformed_request`` naming the parser's ``reason`` (cut to 200 characters)."""
    reason = reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 1] + "…"
    return refusal(400, f"malformed HTTP request: {reason}", CODE, default_headers)


class NamedBadRequests:
    """Mixin for uvicorn's HTTP protocols: :meth:`send_400_response` (which uvicorn calls when its
    parser fails) answers :func:`bad_request_response` with the reason recorded by
    :meth:`note_bad_request`."""

    transport: Any  # annotations only: uvicorn's class has the attributes
    server_state: Any
    _bad_request: str | None = None
    _too_large = False

    def note_bad_request(self, exc: BaseException) -> None:
        self._bad_request = str(exc) or type(exc).__name__
        self._too_large = getattr(exc, "error_status_hint", 400) == 431  # h11's size bound

    def send_400_response(self, msg: str) -> None:
        headers = self.server_state.default_headers
        if self._too_large:
            self.transport.write(too_large_response(head_too_large_message(), headers))
        else:
            self.transport.write(bad_request_response(self._bad_request or msg, headers))
        self.transport.close()


class RecordingParser:
    """An httptools parser that tells its protocol why it failed before uvicorn catches it (the
    parser is an extension type: its methods cannot be replaced on the instance)."""

    def __init__(self, parser: Any, protocol: NamedBadRequests) -> None:
        self._parser, self._protocol = parser, protocol

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:  # not HttpParserUpgrade: not its subclass
            self._protocol.note_bad_request(exc)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


def record_h11_errors(protocol: Any) -> None:
    """Make ``protocol.conn.next_event`` (h11) tell ``protocol`` why it failed."""
    conn = protocol.conn
    next_event = conn.next_event

    def recording() -> Any:
        try:
            return next_event()
        except h11.RemoteProtocolError as exc:
            protocol.note_bad_request(exc)
            raise

    conn.next_event = recording
