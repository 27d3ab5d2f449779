"""``BAYESGATE_EVENT_LOOP``: the loop factories, and the repaired asyncio loop serving a connection
accepted just before its server closed (CPython gh-109564), where the stock loop drops it.

The race is made deterministic by closing the server inside the accept callback, right after
asyncio has accepted the connection and scheduled the task that would make its transport — the
window a shutdown hits by chance under load.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import subprocess
import sys

import pytest

from bayesgate.service.event_loop import (
    LOOP_FACTORIES,
    ServingSelectorEventLoop,
    asyncio_loop,
    auto_loop,
    loop_label,
    uvloop_missing,
)


class Answer(asyncio.Protocol):
    """Answers one read with ``answer:<bytes>`` and closes."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"answer:" + data)  # type: ignore[attr-defined]
        self.transport.close()


def outcome_when_closed_after_accept(loop: asyncio.AbstractEventLoop) -> str:
    """Serve on ``loop``, close the server the moment it has accepted a connection whose request
    is already sent, and return what the client gets: the answer, ``eof`` or ``reset``."""

    async def scenario() -> str:
        servers: list[asyncio.Server] = []
        accept = loop._accept_connection  # type: ignore[attr-defined]

        def accept_then_close(*args: object) -> None:
            accept(*args)  # accepted; the task that makes the transport is scheduled, not run
            servers[0].close()

        loop._accept_connection = accept_then_close  # type: ignore[attr-defined]
        server = await loop.create_server(Answer, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        client.sendall(b"ping")  # before the server's loop runs again: the request is on its way
        client.setblocking(False)
        try:
            for _ in range(100):  # the loop accepts, closes, then answers or drops
                await asyncio.sleep(0.02)
                gc.collect()  # a dropped socket is closed when its object is collected
                try:
                    data = client.recv(100)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    return "reset"
                return data.decode() if data else "eof"
            return "nothing"
        finally:
            client.close()

    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_stock_loop_drops_a_connection_accepted_as_the_server_closes() -> None:
    """The bug the repair exists for. If a CPython release fixes gh-109564 by serving the
    connection, this fails — and the repair (service/event_loop.py) can go."""
    got = outcome_when_closed_after_accept(asyncio.SelectorEventLoop())
    assert got in {"reset", "eof"}, got


def test_the_repaired_loop_serves_a_connection_accepted_as_the_server_closes() -> None:
    assert outcome_when_closed_after_accept(ServingSelectorEventLoop()) == "answer:ping"


def test_the_repaired_loop_still_serves_and_closes_normally() -> None:
    loop = ServingSelectorEventLoop()

    async def scenario() -> tuple[bytes, bool]:
        server = await loop.create_server(Answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x")
        data = await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return data, server.is_serving()

    try:
        assert loop.run_until_complete(scenario()) == (b"answer:x", False)
    finally:
        loop.close()


def test_factories_resolve_as_uvicorn_imports_them() -> None:
    from uvicorn.config import Config

    for name, target in LOOP_FACTORIES.items():
        factory = Config("x:y", loop=target).get_loop_factory()  # uvicorn imports the string
        assert callable(factory), name
    loop = asyncio_loop()
    try:
        assert isinstance(loop, ServingSelectorEventLoop)
    finally:
        loop.close()
    loop = auto_loop()
    try:
        expected = "bayesgate.ServingSelectorEventLoop" if uvloop_missing() else "uvloop.Loop"
        assert loop_label(loop) == expected
    finally:
        loop.close()


def test_auto_falls_back_to_the_repaired_loop_without_uvloop() -> None:
    probe = (
        "import sys; sys.modules['uvloop'] = None\n"  # `import uvloop` raises ImportError
        "from bayesgate.service.event_loop import auto_loop, loop_label, uvloop_missing\n"
        "print(loop_label(auto_loop()), bool(uvloop_missing()))"
    )
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert done.stdout.split() == ["bayesgate.ServingSelectorEventLoop", "True"]


def test_loop_label_names_the_package_and_class() -> None:
    for loop, label in [
        (ServingSelectorEventLoop(), "bayesgate.ServingSelectorEventLoop"),
        (asyncio.SelectorEventLoop(), "asyncio._UnixSelectorEventLoop"),
    ]:
        try:
            assert loop_label(loop) == label
        finally:
            loop.close()
