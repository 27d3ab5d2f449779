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
  when the supervisor exited. :class:`Supervisor` closes its copy before the workers close
  theirs, so the port closes with the last worker and later connections are *refused*, which a
  client (or load balancer) knows was never accepted.

A third, narrower window remains when the listening socket closes: connections whose handshake the
kernel completed but that the event loop had not accepted yet (its accept queue) are reset with
it. :func:`close_listeners`, called when uvicorn's shutdown begins, takes every connection in that
queue first and closes the socket right after. That leaves the two system calls between the last
``accept()`` and ``close()`` (one reset in ~760 connections in a CI run, 2026-11-27), so the
queue is first stopped from growing: :func:`refuse_new_connections` attaches a socket filter that
drops every new connection's SYN (Linux). A client whose SYN is dropped retries after about a
second, finds the port closed and is *refused*; a handshake already under way when the filter goes
on completes (its last ACK is let through) and is served. The filter goes on :data:`REFUSE_LEAD_S`
before the drain delay ends, so such a handshake has that long to complete before the last
``accept()``. The socket is shared by ``--workers N`` processes, and one worker stopping
(uvicorn's rolling restart on SIGHUP) must not stop the others accepting, so there the
:class:`Supervisor` attaches it, and only when it stops them all; a single worker attaches it
itself (:func:`refuse_listeners`, scheduled by :mod:`bayesgate.service.shutdown`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import sys
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.supervisors import Multiprocess

from bayesgate.service.bad_requests import NamedBadRequests, record_h11_errors
from bayesgate.service.lingering_close import LingeringClose

_adopting: set[asyncio.Task[Any]] = set()  # connections being handed to the protocol

SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>; Python's socket module does not name it
TCP_SYN, TCP_ACK = 0x02, 0x10  # flag bits of byte 13 of the TCP header
# Classic BPF, run by the kernel on each segment the listening socket receives, the TCP header at
# offset 0; (code, jt, jf, k) as struct sock_filter. The result is how many bytes to keep: 0 drops.
REFUSE_SYN_FILTER = (
    (0x30, 0, 0, 13),  # ldb [13]           A = the flags byte
    (0x54, 0, 0, TCP_SYN | TCP_ACK),  # and #0x12     A = its SYN and ACK bits
    (0x15, 0, 1, TCP_SYN),  # jeq #0x02, 0, 1    SYN without ACK: a new connection
    (0x06, 0, 0, 0),  # ret #0               drop it
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1       keep anything else whole
)
REFUSE_LEAD_S = 0.25  # new connections are refused this long before the drain delay ends
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


class DrainingH11Protocol(LingeringClose, NamedBadRequests, DrainOnShutdown, H11Protocol):
    """uvicorn's h11 protocol, except that shutdown does not close a connection between requests
    at once: it gets the keep-alive timeout to send one last request, answered and closed; a
    request h11 rejects gets a JSON 400 naming h11's reason
    (:mod:`~bayesgate.service.bad_requests`); and a connection closed while the client is still
    sending lingers (:mod:`~bayesgate.service.lingering_close`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        record_h11_errors(self)

    def client_may_still_send(self) -> bool:
        """A body not yet all received, a head begun, or a stream h11 rejected."""
        their_state = self.conn.their_state
        return (
            self._bad_request is not None
            or their_state is h11.SEND_BODY
            or their_state is h11.ERROR
            or (their_state is h11.IDLE and bool(self.conn.trailing_data[0]))
        )

    def handle_events(self) -> None:
        super().handle_events()
        if self.closing and self.cycle is not None:
            self.cycle.keep_alive = False  # the last request on this connection


def attach_filter(sock: socket.socket, program: tuple[tuple[int, int, int, int], ...]) -> None:
    """Attach a classic BPF ``program`` (``(code, jt, jf, k)`` per instruction, as struct
    sock_filter) to ``sock`` (``SO_ATTACH_FILTER``, Linux); ``OSError`` when refused."""
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in program))
    fprog = struct.pack("HP", len(program), ctypes.addressof(code))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)


def refuse_new_connections(listener: socket.socket) -> bool:
    """Stop ``listener``'s accept queue from growing: attach a classic BPF socket filter
    (:data:`REFUSE_SYN_FILTER`) that drops every SYN opening a new connection and lets every
    other segment through. A client whose SYN is dropped retransmits it (after ~1 s); by then the
    socket is closed and the answer is a reset to the SYN — *connection refused* — never an
    established connection reset with its request. A handshake the kernel had begun (SYN
    answered) completes, as the client already counts it established and may have sent its
    request: its last ACK and data pass, and it joins the queue to be accepted and served.
    (A filter that dropped every segment reset that client when the socket closed, one
    round trip's window at the moment the filter went on.) Connections already queued or
    accepted are not touched; one completed later is cloned with the filter, which then drops
    only a stray bare SYN on it (and so the challenge ACK the kernel would send back: nothing a
    working client needs).

    Shared by every process holding a copy of the socket. Returns False (nothing attached) off
    Linux or when the kernel refuses the filter."""
    if sys.platform != "linux":
        return False
    try:
        attach_filter(listener, REFUSE_SYN_FILTER)
    except OSError as exc:
        inode = socket_inode(listener)  # a socket is tried twice at a shutdown: warn once
        if inode is None or inode not in _filter_refused:
            if inode is not None:
                _filter_refused.add(inode)
            # uvicorn's logger: configured in the supervisor process as well as in the workers
            logging.getLogger("uvicorn.error").warning(
                "cannot stop the listening socket's accept queue from growing (%s): a "
                "connection made just before it closes can be reset",
                exc,
            )
        return False
    return True


_filter_refused: set[int] = set()  # listening sockets (inodes) the kernel refused the filter on


def socket_inode(sock: socket.socket) -> int | None:
    """The socket's inode (the same for every descriptor of it); None when it is closed."""
    try:
        return os.fstat(sock.fileno()).st_ino
    except (OSError, ValueError):
        return None


class Supervisor(Multiprocess):
    """uvicorn's multi-process supervisor that lets go of the listening socket when it stops the
    workers (their copies keep the port open while they drain), first refusing new connections
    (:func:`refuse_new_connections`) :data:`REFUSE_LEAD_S` before the workers' drain delay ends,
    so that the last worker to close the socket resets nothing in its accept queue.

    After SIGTERM the workers get SIGTERM, serve ``drain_delay_s`` more, then close. After SIGINT
    new connections are refused at once: Ctrl-C reaches the workers too, so they skip the delay
    (the SIGTERM that follows is their second signal); a SIGINT sent to the supervisor alone
    leaves them serving their open connections for the delay while new ones are refused."""

    def __init__(self, *args: Any, drain_delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drain_delay_s = drain_delay_s
        self.interrupted = False

    def handle_int(self) -> None:
        self.interrupted = True
        super().handle_int()

    def terminate_all(self) -> None:
        wait_s = 0.0 if self.interrupted else self.drain_delay_s - REFUSE_LEAD_S
        if wait_s <= 0:
            self.refuse_and_close()
        super().terminate_all()  # SIGTERM to each worker
        if wait_s > 0:
            time.sleep(wait_s)  # the workers serve their drain delay meanwhile
            self.refuse_and_close()

    def refuse_and_close(self) -> None:
        for sock in self.sockets:
            if sock.fileno() != -1 and refuse_new_connections(sock):
                # uvicorn's logger: the only one configured in the supervisor process
                logging.getLogger("uvicorn.error").info(
                    "new connections refused from now on (the workers are stopping)"
                )
            sock.close()


def sole_owner(server: Any) -> bool:
    """Whether ``server`` (a ``uvicorn.Server``) is the only process on its listening sockets:
    with ``--workers N > 1`` the :class:`Supervisor` refuses new connections for them all."""
    return getattr(server.config, "workers", 1) <= 1


def refuse_listeners(server: Any) -> int:
    """A single worker's :func:`refuse_new_connections` on each of its listening sockets, a moment
    (:data:`REFUSE_LEAD_S`) before its drain delay ends; how many took the filter. Nothing for a
    worker of ``--workers N > 1``, TLS, or a server not listening. Call on the event loop."""
    if server is None or not getattr(server, "servers", None) or not sole_owner(server):
        return 0
    if getattr(server.config, "ssl", None) is not None:
        return 0  # not used by bayesgate serve: uvicorn closes as it does
    refused = 0
    for listening in server.servers:
        for sock in listening.sockets or ():
            # uvloop's and asyncio's socket wrappers differ; a duplicate is the same socket
            with socket.socket(fileno=os.dup(sock.fileno())) as copy:
                refused += refuse_new_connections(copy)
    return refused


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
    refuse = sole_owner(server)  # else the Supervisor refuses (its docstring)
    for listening in server.servers:
        # A duplicate keeps the socket listening while the loop stops watching it.
        copies = [socket.socket(fileno=os.dup(s.fileno())) for s in listening.sockets or ()]
        if refuse:  # again, or at last when there was no drain delay (SIGINT, delay 0)
            for copy in copies:
                refuse_new_connections(copy)
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
