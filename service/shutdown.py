"""Graceful shutdown under uvicorn: SIGTERM → not ready → drain → exit 0.

uvicorn stops on SIGTERM by closing its listening socket at once, waiting for in-flight requests
(``timeout_graceful_shutdown`` = ``BAYESGATE_DRAIN_TIMEOUT_S``), then running the app's lifespan
shutdown. A load balancer that still routes to the process in the meantime would see refused
connections, so :func:`install_drain_handler` puts one step before that:

1. SIGTERM: readiness (``/readyz``, ``/v2/health/ready``) turns 503 and ``bayesgate_ready`` 0;
   the server keeps accepting and answering requests for ``BAYESGATE_DRAIN_DELAY_S`` (time for the
   load balancer to notice and stop routing), except that new connections are refused for its
   last :data:`~bayesgate.service.http_server.REFUSE_LEAD_S` (0.25 s) so that a handshake under
   way when that begins completes before the last ``accept()``
   (:func:`~bayesgate.service.http_server.refuse_new_connections`);
2. then uvicorn's own handler runs: no new connections, in-flight requests finish (bounded by the
   drain timeout), the lifespan stops the inference worker (nothing is queued any more);
3. the process exits 0.

From step 1 on, every response carries ``Connection: close`` (the middleware reads
``state.draining``), so keep-alive clients reconnect elsewhere instead of being reset. Just before
uvicorn's drain timeout would cancel the remaining requests (uvicorn answers a cancelled request
with a plain-text 500), ``on_stop`` lets the app answer every queued and running job itself with
the documented JSON 503 (see :func:`bayesgate.service.app.go_ready`).

SIGINT (Ctrl-C) and a second SIGTERM skip the delay. The handler is installed only when the
current handler is a uvicorn server's (so tests running the app in-process never touch signals);
it wraps that handler rather than replacing uvicorn's shutdown logic.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from bayesgate.service.http_server import REFUSE_LEAD_S, close_listeners, refuse_listeners

log = logging.getLogger("bayesgate.service")

SignalHandler = Callable[[int, FrameType | None], Any]


def _uvicorn_handler(handler: Any) -> bool:
    try:
        from uvicorn import Server
    except ImportError:  # pragma: no cover - uvicorn is a dependency
        return False
    return isinstance(getattr(handler, "__self__", None), Server)


def install_drain_handler(
    loop: asyncio.AbstractEventLoop,
    delay_s: float,
    on_drain: Callable[[], None],
    on_stop: Callable[[], None] | None = None,
    refuse_early: Callable[[], bool] = lambda: True,
    before_end: Sequence[tuple[float, Callable[[], None]]] = (),
) -> Callable[[], None] | None:
    """Wrap uvicorn's SIGTERM/SIGINT handler (see the module docstring); return an uninstaller.

    ``on_drain`` runs once, on the first signal (it turns readiness off); ``on_stop`` runs once, on
    the loop, when uvicorn's own handler is called (its drain timeout starts then), and the
    listening sockets are closed then, their accept queue served
    (:func:`~bayesgate.service.http_server.close_listeners`). New connections are refused
    :data:`~bayesgate.service.http_server.REFUSE_LEAD_S` before that when ``refuse_early()``
    says so then (not while a native front end relays requests to this port over new
    connections: those would be refused). Each ``(lead_s, callback)`` of ``before_end`` runs on
    the loop ``lead_s`` before the drain delay ends (at once when the delay is shorter), unless
    uvicorn's handler ran first (SIGINT, a second SIGTERM, no delay). Returns None
    (and does nothing) when no uvicorn server handles the signals in this thread.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    if not all(_uvicorn_handler(h) for h in previous.values()):
        return None
    draining = False
    stopped = False

    def stopping(stop: SignalHandler) -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        if on_stop is not None:
            on_stop()
        taken = close_listeners(getattr(stop, "__self__", None))
        if taken:
            log.info("stopped listening; %d connection(s) waiting to be accepted taken", taken)

    def refuse(stop: SignalHandler) -> None:
        if stopped or not refuse_early():
            return
        if refuse_listeners(getattr(stop, "__self__", None)):
            log.info("new connections refused from now on (the drain delay ends in %.3g s)",
                     min(delay_s, REFUSE_LEAD_S))  # fmt: skip

    def ahead(callback: Callable[[], None]) -> None:
        if not stopped:
            callback()

    def delayed_stop(sig: int, stop: SignalHandler) -> None:
        stopping(stop)
        stop(sig, None)

    def begin(sig: int, stop: SignalHandler, delayed: bool) -> None:
        # On the loop, not in the signal handler: on_drain and logging take locks that the
        # interrupted code may hold.
        on_drain()
        if delayed:
            log.info(
                "SIGTERM: readiness off; serving %.3g s more, then draining in-flight requests",
                delay_s,
            )
            for lead_s, callback in before_end:
                loop.call_later(max(0.0, delay_s - lead_s), ahead, callback)
            loop.call_later(max(0.0, delay_s - REFUSE_LEAD_S), refuse, stop)
            loop.call_later(delay_s, delayed_stop, sig, stop)
        else:
            log.info("%s: readiness off; draining in-flight requests", signal.Signals(sig).name)

    def handler(sig: int, frame: FrameType | None) -> None:
        nonlocal draining
        stop: SignalHandler = previous[signal.Signals(sig)]
        first, draining = not draining, True
        delayed = first and sig == signal.SIGTERM and delay_s > 0
        if first:
            loop.call_soon_threadsafe(begin, sig, stop, delayed)
        if not delayed:
            loop.call_soon_threadsafe(stopping, stop)
            stop(sig, frame)  # uvicorn's handler only sets flags: safe here

    for sig in previous:
        signal.signal(sig, handler)

    def uninstall() -> None:
        for sig, old in previous.items():
            if signal.getsignal(sig) is handler:
                signal.signal(sig, old)

    return uninstall
