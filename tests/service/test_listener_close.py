"""The last step of a shutdown: the listening socket closes without resetting a connection.

Closing a listening socket resets every connection still in its accept queue. ``close_listeners``
takes the queue first, but a client whose handshake completes between that last ``accept()`` and
the ``close()`` is queued too late and reset with its request already sent (seen once in ~760
connections through a ``--workers 2`` shutdown, CI 2026-11-27). These tests open that window on
purpose — a client connects right after the last ``accept()`` — and check that with
``refuse_new_connections`` the client is *refused* (its SYN dropped, then answered by the closed
port), and that without it the same client is reset (so the window is real and the tests can
fail); and that a handshake already under way when the filter goes on still completes and is
served. Linux only: the filter is a Linux socket option.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn.supervisors.multiprocess import SIGNALS

from bayesgate.service import http_server
from bayesgate.service.http_server import (
    REFUSE_LEAD_S,
    Supervisor,
    accept_all,
    close_listeners,
    refuse_new_connections,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_ATTACH_FILTER is Linux's")

REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def connect_late(port: int) -> socket.socket:
    """A client whose SYN leaves now; the connection completes or not, without waiting."""
    client = socket.socket()
    client.setblocking(False)
    assert client.connect_ex(("127.0.0.1", port)) == errno.EINPROGRESS
    return client


def outcome(client: socket.socket, timeout: float = 10.0) -> str:
    """``refused``, ``reset`` (connected, request sent, no answer), or ``answered``."""
    _, writable, _ = select.select([], [client], [], timeout)
    assert writable, "the connection attempt neither completed nor failed"
    error = client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error == errno.ECONNREFUSED:
        return "refused"
    if error == errno.ECONNRESET:  # established, then reset before the request was written
        return "reset"
    assert error == 0, errno.errorcode.get(error, error)
    client.setblocking(True)
    client.settimeout(timeout)
    try:
        client.sendall(REQUEST)
        return "answered" if client.recv(100) else "reset"
    except (ConnectionResetError, BrokenPipeError):
        return "reset"
    finally:
        client.close()


def test_a_refusing_socket_queues_no_new_connection_and_refuses_it_once_closed() -> None:
    listener = listening()
    port = listener.getsockname()[1]
    early = socket.create_connection(("127.0.0.1", port), timeout=5)  # queued before
    assert refuse_new_connections(listener)
    late = connect_late(port)
    time.sleep(0.3)  # the late SYN has arrived (and been dropped) by now
    taken = accept_all(listener)
    assert len(taken) == 1, taken  # only the early connection: the late one never completed
    # A connection made before the filter carries data both ways (it was not cloned with it).
    early.sendall(b"ping")
    taken[0].settimeout(5)
    assert taken[0].recv(4) == b"ping"
    taken[0].sendall(b"pong")
    assert early.recv(4) == b"pong"
    listener.close()
    assert outcome(late) == "refused"  # its SYN retransmitted (~1 s) to a closed port
    early.close()
    taken[0].close()


def test_a_handshake_under_way_when_the_filter_goes_on_completes_and_is_served() -> None:
    """A client's handshake the kernel answered before the filter went on, its last ACK and its
    request arriving after: the client counts the connection established, so dropping what it
    sends would reset it (as a drop-everything filter did). ``TCP_DEFER_ACCEPT`` holds that
    moment open on loopback: the kernel keeps the connection half-open, uncounted as queued,
    until its first data arrives."""
    listener = socket.socket()
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 5)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)  # established, client side
    time.sleep(0.1)
    assert accept_all(listener) == []  # not queued yet: the server side waits for data
    assert refuse_new_connections(listener)
    client.sendall(REQUEST)
    late = connect_late(port)  # a new connection now: its SYN is dropped
    deadline = time.monotonic() + 5
    taken: list[socket.socket] = []
    while not taken and time.monotonic() < deadline:
        taken = accept_all(listener)
        time.sleep(0.01)
    assert len(taken) == 1, "the half-open connection was dropped"
    conn = taken[0]
    conn.settimeout(5)
    assert conn.recv(len(REQUEST), socket.MSG_WAITALL) == REQUEST
    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert client.recv(100).startswith(b"HTTP/1.1 204")
    time.sleep(0.3)
    assert accept_all(listener) == []  # the late client never completed
    listener.close()
    assert outcome(late) == "refused"
    conn.close()
    client.close()


def test_without_the_filter_a_client_queued_after_the_last_accept_is_reset() -> None:
    listener = listening()
    late = connect_late(listener.getsockname()[1])
    time.sleep(0.3)  # the kernel completed the handshake and queued it
    listener.close()
    assert outcome(late) == "reset"


class Answering(asyncio.Protocol):
    """What uvicorn's protocol class would be: answers every request with a few bytes."""

    def __init__(self, **_: Any) -> None:
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")


@pytest.mark.parametrize("workers", [1, 2])
def test_close_listeners_refuses_a_client_connecting_after_its_last_accept(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single-worker server (the sole owner of its socket) attaches the filter itself; a worker
    of ``--workers N`` does not (its siblings may go on serving: uvicorn's rolling restart), so
    without the supervisor's filter the same client is reset."""
    late: list[socket.socket] = []

    def accept_then_connect(listener: socket.socket) -> list[socket.socket]:
        taken = accept_all(listener)
        late.append(connect_late(listener.getsockname()[1]))
        time.sleep(0.2)  # the gap between the last accept() and close(), held open
        return taken

    monkeypatch.setattr(http_server, "accept_all", accept_then_connect)

    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        sock = listening()
        served = await loop.create_server(Answering, sock=sock)
        server = SimpleNamespace(
            servers=[served],
            config=SimpleNamespace(ssl=None, workers=workers, http_protocol_class=Answering),
            server_state=None,
            lifespan=SimpleNamespace(state={}),
        )
        return close_listeners(server)

    assert asyncio.run(scenario()) == 0
    assert outcome(late[0]) == ("refused" if workers == 1 else "reset")


@pytest.fixture
def restore_signals() -> Iterator[None]:
    """uvicorn's supervisor installs its own handlers for SIGINT, SIGTERM, SIGHUP…"""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def supervisor(sock: socket.socket, drain_delay_s: float) -> Supervisor:
    config = SimpleNamespace(workers=2)
    return Supervisor(config, sockets=[sock], drain_delay_s=drain_delay_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("drain_delay_s", [1.0, 0.1])
def test_the_supervisor_refuses_new_connections_just_before_the_workers_drain_delay_ends(
    drain_delay_s: float, restore_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It signals the workers, waits the delay less ``REFUSE_LEAD_S``, attaches the filter to
    the shared socket and lets go of its copy; with a delay shorter than the lead it refuses
    before it signals them. The workers' copy (a ``dup`` here) then queues nothing new."""
    sock = listening()
    port = sock.getsockname()[1]
    worker_copy = socket.socket(fileno=sock.dup().detach())
    signalled_with_socket_open: list[bool] = []
    monkeypatch.setattr(
        http_server.Multiprocess,
        "terminate_all",
        lambda self: signalled_with_socket_open.append(sock.fileno() != -1),
    )
    slept: list[float] = []  # what it asked to wait (wall time on a loaded machine says less)
    clock = SimpleNamespace(sleep=lambda s: slept.append(s) or time.sleep(s))
    monkeypatch.setattr(http_server, "time", clock)  # the module's own name only
    supervisor(sock, drain_delay_s).terminate_all()
    expected_wait = drain_delay_s - REFUSE_LEAD_S
    assert slept == ([pytest.approx(expected_wait)] if expected_wait > 0 else []), slept
    assert signalled_with_socket_open == [drain_delay_s > REFUSE_LEAD_S]
    assert sock.fileno() == -1  # the supervisor's copy is closed
    late = connect_late(port)
    time.sleep(0.3)
    assert accept_all(worker_copy) == []  # dropped: nothing new reaches the workers' queue
    worker_copy.close()
    assert outcome(late) == "refused"


def test_after_sigint_the_supervisor_refuses_at_once(
    restore_signals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = listening()
    monkeypatch.setattr(http_server.Multiprocess, "terminate_all", lambda self: None)
    sup = supervisor(sock, drain_delay_s=30)
    sup.handle_int()
    started = time.monotonic()
    sup.terminate_all()
    assert time.monotonic() - started < 1.0
    assert sock.fileno() == -1


def test_a_socket_the_filter_cannot_go_on_is_reported_not_raised() -> None:
    """A kernel (or sandbox) that refuses the filter leaves the gap open: shutdown goes on, with
    a warning naming the consequence (on uvicorn's logger, configured in every process)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("uvicorn.error")
    saved = logger.level, logger.disabled
    logger.setLevel(logging.WARNING)  # whatever an earlier test's logging config left
    logger.disabled = False
    logger.addHandler(handler)  # directly: uvicorn's logging config may stop propagation
    sock = listening()
    sock.close()  # setsockopt on a closed socket fails (EBADF), as a refused filter would
    try:
        assert refuse_new_connections(sock) is False
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.disabled = saved[1]
    (record,) = records
    assert "can be reset" in record.getMessage() and "Bad file descriptor" in record.getMessage()


def test_a_socket_the_filter_cannot_go_on_is_reported_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A single worker tries the filter twice at a shutdown (before the drain delay ends and
    again before its last ``accept()``), through different descriptors of the same socket: a
    kernel that refuses it gets one warning, not two."""

    def refused(sock: socket.socket, program: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(http_server, "attach_filter", refused)
    logger = logging.getLogger("uvicorn.error")
    monkeypatch.setattr(logger, "disabled", False)
    monkeypatch.setattr(logger, "propagate", True)
    with listening() as sock, socket.socket(fileno=os.dup(sock.fileno())) as copy:
        other = listening()
        with caplog.at_level(logging.WARNING, logger="uvicorn.error"), other:
            results = [refuse_new_connections(s) for s in (sock, copy, sock, other)]
    assert results == [False] * 4
    # distinct records: after an in-process app has configured logging (uvicorn.error then does
    # not propagate), pytest hangs its capture handler on that logger too, so with propagation
    # turned back on above each record reaches the handler twice (a test-order effect only)
    found = [r for r in caplog.records if "cannot stop the listening socket" in r.getMessage()]
    warnings = list({id(r): r for r in found}.values())
    assert len(warnings) == 2, warnings  # one for sock (and its copy), one for the other socket
