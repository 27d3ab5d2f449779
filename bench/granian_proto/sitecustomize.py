"""Prototype (issue 19): the service behind granian, a Rust HTTP server, instead of uvicorn.

Not part of the service, and not a candidate as it stands: it measures how much of the CPU per
request a front end whose HTTP parsing, connection handling and response writing are native code
could save at one image per request. Put this directory first on ``PYTHONPATH`` and set
``BAYESGATE_GRANIAN_PROTO=1`` (``pip install granian``); ``bayesgate serve`` then runs
``granian_app:app`` (RSGI, one worker process, one Rust runtime thread) on the same host and port
instead of uvicorn. ``/v2`` binary infer requests are answered by the RSGI app itself; every other
request goes through a small RSGI → ASGI bridge to the unchanged FastAPI app (see
``granian_app.py`` for what the fast route leaves out). With ``BAYESGATE_GRANIAN_PROTO=asgi``
granian runs the unchanged FastAPI app on its ASGI interface instead: every request through the
app, middleware and routes as under uvicorn — only the HTTP server is another.

    PYTHONPATH=bench/granian_proto BAYESGATE_GRANIAN_PROTO=1 \\
        python bench/load.py --protocols "/v2 binary" --duration 10
"""

from __future__ import annotations

import os

MODE = os.environ.get("BAYESGATE_GRANIAN_PROTO")

if MODE in ("1", "asgi"):
    from typing import Any

    from bayesgate.service import cli

    def run_granian(config: Any, **_: Any) -> None:
        import multiprocessing

        from granian.constants import Interfaces

        # `bayesgate serve` loaded the model (torch's thread pools) before this: a forked worker
        # hangs in its first forward pass, a spawned one starts clean.
        multiprocessing.set_start_method("spawn", force=True)
        from granian.server import Server

        if MODE == "asgi":  # the unchanged FastAPI app, lifespan and all, on granian's ASGI
            target, interface = "bayesgate.service.app:create_app", Interfaces.ASGI
        else:
            target, interface = "granian_app:app", Interfaces.RSGI
        Server(
            target,
            address=config.host,
            port=config.port,
            interface=interface,
            factory=MODE == "asgi",
            workers=1,
            runtime_threads=int(os.environ.get("BAYESGATE_GRANIAN_RUNTIME_THREADS", "1")),
            log_access=False,
        ).serve()

    cli.run_uvicorn = run_granian
