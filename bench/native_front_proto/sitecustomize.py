"""Prototype (issue 19): a native front end with native batching, the service behind it.

Not part of the service, and not a candidate as it stands: it measures what option (ii) of the
issue-19 notes — the request path outside Python, Python called once per batch — costs per image
at one image per request. Put this directory first on ``PYTHONPATH`` and set
``BAYESGATE_NATIVE_PROTO=1`` (needs ``cargo``; the crate in ``rust/`` has no dependencies and
builds offline into ``~/.cache/bayesgate/native-front-target``); ``bayesgate serve`` then runs:

- the unchanged service (uvicorn, the FastAPI app, its worker) on an internal loopback port;
- once that is ready, the Rust front end on the public host and port, and the
  :class:`~native_front.Bridge` thread that runs its batches through the service's own engine and
  model. ``/v2`` binary infer requests it can take are answered there; every other request is
  relayed to the service.

    PYTHONPATH=bench/native_front_proto BAYESGATE_NATIVE_PROTO=1 \\
        python bench/load.py --protocols "/v2 binary" --duration 10

With ``BAYESGATE_NATIVE_PROTO_PATH=worker`` the bridge hands each batch to the service's own
worker as one job (its queue, admission by image-passes, deadline, stop checks between layers,
grouping with the Python routes' jobs, stats) and turns the worker's per-image answers back into
arrays; by default it calls the engine itself.

What it leaves out (so its CPU figure is a lower bound for a real implementation): the
client-disconnect watch, the access log and HTTP metrics of the fast requests, the admission hold
by image-passes (its queue is bounded by images; the worker path adds the worker's own), a model
reload (the front end keeps the name,
outputs and default K it started with), and the drain of fast requests in flight at shutdown.
"""

from __future__ import annotations

import os

if os.environ.get("BAYESGATE_NATIVE_PROTO") == "1":
    import socket
    import threading
    import time
    import urllib.request
    from typing import Any

    from bayesgate.service import app as app_module
    from bayesgate.service import cli

    apps: list[Any] = []
    create_app = app_module.create_app

    def capture_app() -> Any:
        app = create_app()
        apps.append(app)
        return app

    app_module.create_app = capture_app  # uvicorn imports it by name, after this

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def attach(host: str, port: int, internal: int, fronts: list[Any]) -> None:
        """Wait for the service to be ready, then start the front end and the bridge."""
        from native_front import Bridge, NativeFront, build_library, front_config

        library = build_library()
        ready = f"http://127.0.0.1:{internal}/v2/health/ready"
        while True:
            try:
                with urllib.request.urlopen(ready, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        state = apps[0].state
        worker, settings = state.worker, state.settings
        capacity = max(settings.max_batch_size, settings.max_instances)
        config = front_config(
            worker.model, settings, host, port, f"127.0.0.1:{internal}", settings.max_batch_size
        )
        front = NativeFront(library, config)
        through_worker = os.environ.get("BAYESGATE_NATIVE_PROTO_PATH") == "worker"
        bridge = Bridge(
            front,
            worker,
            capacity,
            through_worker=through_worker,
            request_timeout_s=settings.request_timeout_s,
        )
        bridge.start()
        fronts.append(bridge)

    def run_native(config: Any) -> None:
        host, port, internal = config.host, config.port, free_port()
        config.host, config.port = "127.0.0.1", internal
        fronts: list[Any] = []
        threading.Thread(
            target=attach, args=(host, port, internal, fronts), name="native-attach", daemon=True
        ).start()
        try:
            cli.run_uvicorn_plain(config)
        finally:
            for bridge in fronts:
                bridge.stop()

    cli.run_uvicorn_plain = cli.run_uvicorn
    cli.run_uvicorn = run_native
