"""What ``bayesgate serve`` changes in uvicorn so that a shutdown resets no accepted connection.

uvicorn's graceful shutdown closes the listening socket, then closes at once every connection that
is not in the middle of a request. Two kinds of accepted connections were reset that way under
steady load (``bench/hostile.py --only sigterm1 sigterm2``):

- a connection accepted just before the listener closed whose request had not been read yet
  (a client connecting, or reusing an idle keep-alive connection, at that moment): its request
  bytes were in the socket when the server closed it — a reset.
  :class:`DrainingH11Protocol` keeps such a connection instead, as any idle keep-alive connection,
  for at most ``timeout_keep_alive`` (``BAYESGATE_KEEP_ALIVE_TIMEOUT_S``): a request arriving in
  that time is answered (with ``Connection: close``), then the connection is closed;
- with ``--workers N > 1`` the supervisor process holds its own copy of the listening socket
  until it exits. Once every worker had stopped accepting, the kernel still completed the
  handshake of new connections (the socket was listening) and queued them — to reset them all
  when the supervisor exited. :class:`Supervisor` closes its copy when it starts stopping the
  workers, so the port closes with the last worker and later connections are *refused*, which a
  client (or load balancer) knows was never accepted.

A third, narrower window remains when the listening socket closes: connections whose handshake the
kernel completed but that the event loop had not accepted yet (its accept queue) are reset with
it. :func:`close_listeners`, called when uvicorn's shutdown begins, takes every connection in that
queue first and closes the socket right after, so the window shrinks from one event-loop turn to
the two system calls between the last ``accept()`` and ``close()``.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.supervisors import Multiprocess

from bayesgate.service.bad_requests import NamedBadRequests, record_h11_errors

_adopting: set[asyncio.Task[Any]] = set()  # connections being handed to the protocol

# uvicorn's Config(http=...) takes an import string; the worker processes import it themselves.
DRAINING_H11 = "bayesgate.service.http_server:DrainingH11Protocol"


class DrainOnShutdown:
    """A uvicorn HTTP protocol's ``shutdown`` that does not close a connection between requests
    at once: it gets the keep-alive timeout to send one last request, answered with
    ``Connection: close`` (the protocol sets ``cycle.keep_alive = False`` while ``closing``).
    Mixed into both parsers' protocols, before uvicorn's class."""

    closing = False
    cycle: Any
    transport: Any
    loop: Any
    timeout_keep_alive: float
    timeout_keep_alive_task: Any
    timeout_keep_alive_handler: Any  # annotations only: uvicorn's class has the attributes

    def shutdown(self) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # in the middle of a request: as uvicorn does
            return
        if self.transport.is_closing():
            return
        self.closing = True
        if self.timeout_keep_alive_task is None:  # never sent a request: no timer running yet
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )


class DrainingH11Protocol(NamedBadRequests, DrainOnShutdown, H11Protocol):
    """uvicorn's h11 protocol, except that shutdown does not close a connection between requests
    at once: it gets the keep-alive timeout to send one last request, answered and closed; and a
    request h11 rejects gets a JSON 400 naming h11's reason
    (:mod:`~bayesgate.service.bad_requests`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        record_h11_errors(self)

    def handle_events(self) -> None:
        super().handle_events()
        if self.closing and self.cycle is not None:
            self.cycle.keep_alive = False  # the last request on this connection


class Supervisor(Multiprocess):
    """uvicorn's multi-process supervisor that lets go of the listening socket when it starts
    stopping the workers (their copies keep the port open while they drain)."""

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        super().terminate_all()


def close_listeners(server: Any) -> int:
    """Stop listening (a ``uvicorn.Server``'s sockets), serving the connections already waiting
    in the kernel's accept queue; return how many were taken. Call on the event loop."""
    if server is None or not getattr(server, "servers", None):
        return 0
    config = server.config
    if getattr(config, "ssl", None) is not None:
        return 0  # not used by bayesgate serve: uvicorn closes as it does

    def protocol() -> asyncio.Protocol:
        return config.http_protocol_class(
            config=config, server_state=server.server_state, app_state=server.lifespan.state
        )

    loop = asyncio.get_running_loop()
    waiting: list[socket.socket] = []
    for listening in server.servers:
        # A duplicate keeps the socket listening while the loop stops watching it.
        copies = [socket.socket(fileno=os.dup(s.fileno())) for s in listening.sockets or ()]
        listening.close()
        for copy in copies:
            waiting.extend(accept_all(copy))
            copy.close()
    for conn in waiting:
        task = loop.create_task(loop.connect_accepted_socket(protocol, sock=conn))
        _adopting.add(task)
        task.add_done_callback(_adopting.discard)
    return len(waiting)


def accept_all(listener: socket.socket) -> list[socket.socket]:
    """Every connection in ``listener``'s accept queue, without waiting."""
    listener.setblocking(False)
    taken = []
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return taken
        except OSError:  # closed or not listening
            return taken
        taken.append(conn)


def http_protocol(parser: str) -> str:
    """uvicorn's ``http=`` import string for ``BAYESGATE_HTTP_PARSER`` (auto, httptools, h11):
    auto is httptools when it is installed (it is part of ``uvicorn[standard]``), else h11."""
    if parser == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:
            parser = "h11"
        else:
            parser = "httptools"
    if parser == "httptools":
        from bayesgate.service.httptools_protocol import BOUNDED_HTTPTOOLS

        return BOUNDED_HTTPTOOLS
    return DRAINING_H11
