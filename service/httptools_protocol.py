"""uvicorn's httptools protocol with the request-head bounds and the shutdown of h11's.

uvicorn's h11 parser costs about 0.13 ms per request, httptools about 0.04 ms
(``bench/asgi_floor.py``), but uvicorn bounds the request head only with h11
(``h11_max_incomplete_event_size``). :class:`BoundedHttpToolsProtocol` counts the head itself:

- the bytes received while a head is incomplete (request line, headers, and whatever the parser
  still buffers of a header cut in the middle). Past ``BAYESGATE_MAX_HEADER_BYTES`` the client gets
  JSON 431 ``headers_too_large`` and the connection is closed, so at most that limit plus one read
  of the socket is held per connection;
- the headers of a head: past ``BAYESGATE_MAX_HEADER_COUNT`` the same 431 and close, without
  waiting for the rest of the head.

A complete head within both limits reaches the app, whose middleware checks the header count and
bytes again exactly (431, ``Connection: close``), as with h11. Shutdown is the same as
with h11 (:class:`~bayesgate.service.http_server.DrainOnShutdown`): a connection between requests is
kept for the keep-alive timeout and its last request answered with ``Connection: close``.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from bayesgate.service.bad_requests import (
    NamedBadRequests,
    RecordingParser,
    head_limits,
    head_too_large_message,
    too_large_response,
)
from bayesgate.service.http_server import DrainOnShutdown
from bayesgate.service.lingering_close import LingeringClose

# uvicorn's Config(http=...) takes an import string; the worker processes import it themselves.
BOUNDED_HTTPTOOLS = "bayesgate.service.httptools_protocol:BoundedHttpToolsProtocol"


class BoundedHttpToolsProtocol(
    LingeringClose, NamedBadRequests, DrainOnShutdown, HttpToolsProtocol
):
    """httptools with bounded request heads, a shutdown that resets no waiting request
    (:class:`~bayesgate.service.http_server.DrainOnShutdown`), a JSON 400 naming the parser's
    reason for a request it rejects (:mod:`~bayesgate.service.bad_requests`), and a lingering
    close while the client is still sending (:mod:`~bayesgate.service.lingering_close`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser = RecordingParser(self.parser, self)  # type: ignore[assignment]

    _awaiting_head = True  # a new connection's first bytes are a head
    _head_bytes = 0
    _head_count = 0
    _refused = False
    _mid_message = False  # from a request's first byte to its end

    def client_may_still_send(self) -> bool:
        """A request begun and not ended, or a stream refused or rejected by the parser."""
        return self._mid_message or self._refused or self._bad_request is not None

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        max_bytes, _ = head_limits()
        if self._awaiting_head and self._head_bytes > max_bytes:
            self.refuse(head_too_large_message())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._mid_message = True
        self._awaiting_head = True
        self._head_count = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_count += 1
        _, max_count = head_limits()
        if self._head_count > max_count:
            self.refuse(
                f"more than {max_count} request headers, at most {max_count} allowed "
                "(BAYESGATE_MAX_HEADER_COUNT)"
            )
            return
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._awaiting_head = False
        self._head_bytes = 0
        super().on_headers_complete()
        if self.closing and self.cycle is not None:
            self.cycle.keep_alive = False  # the last request on this connection

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._mid_message = False
        self._awaiting_head = True
        self._head_bytes = 0

    def refuse(self, message: str) -> None:
        """Answer 431 and close (the parser is fed no more)."""
        self._refused = True
        self.logger.warning("request head refused: %s", message)
        self.transport.write(too_large_response(message, self.server_state.default_headers))
        self.transport.close()
