"""The event loop ``bayesgate serve`` runs uvicorn on (``BAYESGATE_EVENT_LOOP``).

- ``uvloop`` (the default when it is installed, as uvicorn's own ``auto``): libuv's loop. It
  creates a connection's transport in the same callback that accepts it.
- ``asyncio``: the standard library's selector loop, with one repair. asyncio accepts a
  connection in the listening socket's read callback but creates its transport in a task one
  loop turn later, and that transport registers with its ``Server`` (``Server._attach``, which
  asserts the server is still open). When the server is closed in between — as every shutdown
  closes it, while connections keep arriving — the assertion fails inside the task, is swallowed,
  and the accepted socket is dropped: the client, whose request is already sent, gets a
  **connection reset** (CPython gh-109564, open; reproduced on 3.10–3.13). Measured with
  ``--workers 2`` under clients that keep connecting through a SIGTERM
  (``tests/service/test_service_shutdown_connections.py``): 2–4 resets in about 700
  connections in 3 of 10 runs on the stock loop, none on this one.
  :class:`ServingSelectorEventLoop` serves such a connection instead, as a connection the server
  never tracked (``server=None``: what ``loop.connect_accepted_socket`` makes). Its response
  carries ``Connection: close``, as every response after SIGTERM does (``service/shutdown.py``).
- ``auto``: ``uvloop`` when it imports, else ``asyncio``.

uvicorn takes a loop factory as an import string (``Config(loop=...)``); the worker processes of
``--workers N`` import it themselves.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any, Literal

EventLoopName = Literal["auto", "uvloop", "asyncio"]

# uvicorn's Config(loop=...) import strings, one per setting value
LOOP_FACTORIES: dict[str, str] = {
    "auto": "bayesgate.service.event_loop:auto_loop",
    "uvloop": "bayesgate.service.event_loop:uvloop_loop",
    "asyncio": "bayesgate.service.event_loop:asyncio_loop",
}


class ServingSelectorEventLoop(asyncio.SelectorEventLoop):  # type: ignore[misc,valid-type]
    """asyncio's selector loop, except that a connection accepted while the server was open is
    served even when the server closed before its transport was made (see the module docstring).
    """

    async def _accept_connection2(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        conn: Any,
        extra: dict[str, Any],
        sslcontext: Any = None,
        server: asyncio.Server | None = None,
        *rest: Any,
    ) -> None:
        # asyncio calls this positionally: (factory, conn, extra, sslcontext, server, timeouts…)
        if server is not None and not server.is_serving():
            server = None  # closed since the accept: serve it untracked rather than drop it
        await super()._accept_connection2(  # type: ignore[misc]
            protocol_factory, conn, extra, sslcontext, server, *rest
        )


def asyncio_loop() -> asyncio.AbstractEventLoop:
    """The standard library's loop: :class:`ServingSelectorEventLoop` (Windows: its default)."""
    if sys.platform == "win32":  # pragma: no cover - the proactor loop accepts differently
        return asyncio.new_event_loop()
    return ServingSelectorEventLoop()


def uvloop_missing() -> str | None:
    """Why uvloop cannot be used here (not installed), or None."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "uvloop is not installed (pip install uvloop), or choose auto or asyncio"
    return None


def uvloop_loop() -> asyncio.AbstractEventLoop:
    """libuv's loop (``bayesgate serve`` checks first that uvloop imports)."""
    import uvloop

    return uvloop.new_event_loop()


def auto_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it imports, else :func:`asyncio_loop`."""
    return asyncio_loop() if uvloop_missing() else uvloop_loop()


def loop_label(loop: asyncio.AbstractEventLoop) -> str:
    """``package.Class`` of a loop, for the ready log line: ``uvloop.Loop``,
    ``bayesgate.ServingSelectorEventLoop``, or the stock ``asyncio._UnixSelectorEventLoop``."""
    kind = type(loop)
    return f"{kind.__module__.split('.')[0]}.{kind.__name__}"
