"""Lingering close: a connection closed while its client is still sending is half-closed, not reset.

When the server closes a connection whose client has not finished its request — a 413 answered
before the body, a 431 for a head still arriving, a JSON 400 for a stream the parser rejected, a
408 for a body that stalled — the kernel answers the bytes still arriving with a TCP reset, and
the client's next write fails. A client that writes its whole request before it reads (Python's
``urllib`` and ``http.client``, which also send ``Connection: close``) then reports "connection
reset by peer" or "broken pipe" instead of the service's JSON error; with a 9 MB body to
``/v1/predict`` it did every time (``tests/service/test_service_lingering_close.py``).

As nginx's ``lingering_close``: the response already written is flushed, the write side is shut
(the client reads the response, then end of stream), and what the client still sends is read and
dropped until it closes its side, for at most ``BAYESGATE_LINGER_IDLE_S`` between two reads and
``BAYESGATE_LINGER_S`` in all; then the connection is closed. A close between requests (the
keep-alive timeout, the shutdown of an idle connection, a complete request answered with
``Connection: close``) is immediate, as before; so is one on TLS (no half-close there) or with
``BAYESGATE_LINGER_S=0``.

:class:`LingeringClose` is mixed into both parsers' protocols (first in their bases). It hands
uvicorn a :class:`LingeringTransport`, whose ``close`` does the above: uvicorn's protocol is
swapped for a :class:`DrainProtocol` that drops the bytes and passes the eventual
``connection_lost`` on to it, so uvicorn's bookkeeping (its connection set, keep-alive timer)
runs exactly once, when the socket is really closed. A request still running when lingering
starts (a pipelined request behind one the parser rejected) is told of the disconnect at once and
its answer is dropped, as a closed transport dropped it; the half-close waits for the answer to
be flushed, and a reset that races it closes the connection instead of raising into uvicorn.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bayesgate.service.settings import protocol_settings


def linger_times() -> tuple[float, float]:
    """``(linger_s, linger_idle_s)`` of the serving process's settings."""
    settings = protocol_settings()
    return settings.linger_s, settings.linger_idle_s


class DrainProtocol(asyncio.Protocol):
    """What a lingering connection talks to: half-closes it once the answer is flushed, drops
    what arrives, closes at the client's end of stream, after ``idle_s`` without a byte or
    ``total_s`` in all; ``connection_lost`` goes on to the HTTP protocol it replaced."""

    def __init__(
        self, transport: asyncio.Transport, protocol: Any, total_s: float, idle_s: float
    ) -> None:
        self.transport, self.protocol = transport, protocol
        self.total_s, self.idle_s = total_s, idle_s
        self.start = self.last = time.monotonic()
        self.loop = asyncio.get_running_loop()
        self.timer = self.loop.call_later(min(idle_s, total_s), self.check)

    def half_close(self) -> None:
        """Shut the write side once the transport's buffer is empty (asyncio's own deferred
        ``shutdown`` after a buffered answer raises into the loop if the client has reset), and
        close instead if that fails (a reset raced it: ENOTCONN)."""
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size():
            self.loop.call_later(0.02, self.half_close)  # ends with the timer's close
            return
        try:
            self.transport.write_eof()
        except OSError:
            self.transport.close()

    def check(self) -> None:
        """Close once idle for ``idle_s`` or lingering ``total_s``; else look again then."""
        now = time.monotonic()
        due = min(self.last + self.idle_s, self.start + self.total_s)
        if now >= due:
            self.transport.close()
        else:
            self.timer = self.loop.call_later(due - now, self.check)

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()

    def eof_received(self) -> bool:
        self.transport.close()  # the client has sent everything and read the response
        return False

    def pause_writing(self) -> None:  # the response may still be in the transport's buffer
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.protocol.connection_lost(exc)


def _drop(data: Any) -> None:
    """A lingering connection's writes: the request they answer was told of its disconnect."""


class LingeringTransport:
    """The transport uvicorn's protocol sees: the real one, except that :meth:`close` lingers
    while the protocol's client may still be sending (``protocol.client_may_still_send()``), and
    that once it has, writes are dropped (as they were once the transport was closed)."""

    def __init__(self, transport: asyncio.Transport, protocol: Any) -> None:
        self._transport, self._protocol = transport, protocol
        self._closing = False
        # what uvicorn calls per request, bound here: no proxy call on the hot path (a method
        # that checked `drain` cost ~0.7 µs per write here, __getattr__ ~1.7 µs, against ~0.08)
        self.write = transport.write
        self.writelines = transport.writelines
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        transport = self._transport
        total_s, idle_s = linger_times()
        if (
            transport.is_closing()
            or total_s <= 0
            or not transport.can_write_eof()
            or not self._protocol.client_may_still_send()
        ):
            transport.close()
            return
        self._protocol.end_request()  # a request still running gets its disconnect now
        self.write = self.writelines = _drop  # as a closed transport dropped them
        drain = DrainProtocol(transport, self._protocol, total_s, idle_s)
        try:
            transport.set_protocol(drain)
            transport.resume_reading()  # uvicorn may have paused it (a body it did not read)
        except (OSError, RuntimeError):
            transport.close()
            return
        drain.half_close()

    def lost(self) -> None:
        """The socket closed by itself: nothing to linger for."""
        self._closing = True

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LingeringClose:
    """Mixin for uvicorn's HTTP protocols (first in the bases): their transport is a
    :class:`LingeringTransport`. The protocol says whether its client may still be sending."""

    transport: Any  # annotations only: uvicorn's class has the attribute

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(LingeringTransport(transport, self))  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        if isinstance(self.transport, LingeringTransport):
            self.transport.lost()  # uvicorn's own close() here must not start lingering
        super().connection_lost(exc)  # type: ignore[misc]

    def client_may_still_send(self) -> bool:
        """True while a request is incomplete or the stream was refused (override)."""
        raise NotImplementedError

    def end_request(self) -> None:
        """What uvicorn's ``connection_lost`` tells a request still running (its app sees
        ``http.disconnect``, its answer is dropped), told when lingering starts instead of up to
        ``BAYESGATE_LINGER_S`` later."""
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
