"""The FastAPI app factory and its lifespan.

Lifespan: load the model (store, sha256-checked) → start the inference thread (the model's one
owner) → warm-up batch → ready (metrics on, SIGTERM drain handler installed, admin watcher started
when several processes share a runtime directory) → serve → not ready → stop the worker.

``create_app()`` with no argument reads :class:`~bayesgate.service.settings.Settings` from the
environment; this is what ``bayesgate serve`` hands to uvicorn (``factory=True``), so every
uvicorn worker process builds its own app, model and inference thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from fastapi import FastAPI

from bayesgate.service.auth import key_digest
from bayesgate.service.control import ModelControl
from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import (
    AllowedMethods,
    ServiceError,
    StartupError,
    install_error_handlers,
)
from bayesgate.service.event_loop import loop_label
from bayesgate.service.http_server import REFUSE_LEAD_S
from bayesgate.service.inference_protocol import infer_request_model
from bayesgate.service.logs import configure_logging
from bayesgate.service.metrics import Metrics
from bayesgate.service.middleware import (
    BodyLimitMiddleware,
    RequestContextMiddleware,
    StartupMessageMiddleware,
)
from bayesgate.service.routes import api_routers, route_methods, route_templates
from bayesgate.service.routes.api_docs import docs_router
from bayesgate.service.routes.lean import LeanRoutes, PredictEndpoint
from bayesgate.service.routes.v2_infer import InferEndpoint
from bayesgate.service.schemas import exact_integer_bounds, predict_request_model
from bayesgate.service.served_model import ServedModel, load_served_model
from bayesgate.service.settings import Settings
from bayesgate.service.shutdown import install_drain_handler
from bayesgate.service.worker import BatchWorker
from bayesgate.service.worker_stats import WorkerStats

log = logging.getLogger("bayesgate.service")

WARMUP_TIMEOUT_S = 120.0


# --- lifespan steps ---------------------------------------------------------------------------


async def load_model(settings: Settings, state: Any) -> ServedModel:
    """The configured model; a :class:`StartupError` is kept for the one-line start-up message."""
    try:
        return await asyncio.to_thread(load_served_model, settings.model_dir, settings.device)
    except StartupError as exc:
        state.startup_error = str(exc)
        raise


def start_worker(served: ServedModel, settings: Settings) -> BatchWorker:
    """The inference thread, owning ``served``."""
    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    worker = BatchWorker(
        served,
        max_batch_size=settings.max_batch_size,
        max_queue_delay_s=settings.max_queue_delay_s,
        queue_capacity=settings.queue_capacity,
        max_queued_work=settings.max_queued_work,
    )
    worker.start()
    return worker


async def warm_up(worker: BatchWorker, settings: Settings, state: Any) -> None:
    """One batch of blank images through the worker (first-call allocations, kernels); a failure
    stops the worker and the start-up."""
    served = worker.model
    batch = min(settings.max_batch_size, settings.max_instances)
    x = torch.zeros(batch, *served.input_shape)
    try:
        k = default_mc_samples(settings, served)
        await worker.predict(x, k, seed=0, timeout_s=WARMUP_TIMEOUT_S)
    except ServiceError as exc:
        worker.stop()
        state.startup_error = f"warm-up batch failed: {exc.message}"
        raise StartupError(state.startup_error) from exc
    worker.stats = WorkerStats()  # the warm-up batch is not traffic
    warn_if_default_k_capped(settings, served)
    freeze_startup_objects()


def warn_if_default_k_capped(settings: Settings, served: Any) -> bool:
    """Log one warning when ``BAYESGATE_MAX_MC_SAMPLES`` makes the default K of a request smaller
    than the K the flag's threshold was set at (the flag's false-positive rate is then not the
    calibrated one); True when it did."""
    basis = served.basis
    if settings.default_mc_samples is not None or basis.k <= settings.max_mc_samples:
        return False
    log.warning(
        "default K %d (BAYESGATE_MAX_MC_SAMPLES) is below the K %d the flag's threshold was set "
        "at (%s): the flag's false-positive rate is not the calibrated one at that K",
        settings.max_mc_samples,
        basis.k,
        basis.source,
    )
    return True


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, the model, FastAPI's routes: most of the
    heap) out of the garbage collector's reach (``gc.freeze``) until shutdown (``gc.unfreeze``
    in :func:`shut_down`): a full collection under load then walks only the objects made since.
    Without it one stalled the event loop (and every thread) for up to 145 ms (issue 18,
    docs/service.md)."""
    gc.freeze()


def drain_answer_after(drain_timeout_s: float) -> float:
    """Seconds after uvicorn starts draining at which the app answers what is left with 503:
    before uvicorn cancels the requests at ``drain_timeout_s`` (plus its own 0.1 s), by a margin
    of 0.5 s (a quarter of the timeout when that is shorter) for the answers to be written."""
    return max(0.0, drain_timeout_s - min(0.5, drain_timeout_s / 4))


@dataclass
class Serving:
    """What runs while the app is ready, and how to stop it."""

    worker: BatchWorker
    watcher: asyncio.Task[None] | None
    uninstall_drain: Callable[[], None] | None
    grpc_server: Any = None  # grpc.aio.Server when BAYESGATE_GRPC_PORT is set
    grace_s: float = 0.0  # how long the gRPC server may finish in-flight calls at shutdown
    native: Any = None  # NativeBridge when BAYESGATE_NATIVE_PORT is set
    native_collector: Any = None  # its /metrics collector
    native_grace_s: float = 0.0  # from its drain's start: longest wait for accepted requests


def go_ready(
    state: Any, settings: Settings, metrics: Metrics, worker: BatchWorker, control: ModelControl
) -> Serving:
    """Metrics on, ready, SIGTERM drain handler, admin watcher (shared runtime directory)."""
    worker.metrics = metrics
    state.ready = True
    metrics.set_ready(True)

    def on_drain() -> None:
        state.draining = True
        metrics.set_ready(False)

    def on_stop() -> None:
        native = getattr(state, "native", None)
        if native is not None:  # stops accepting with uvicorn; answers what it accepted
            native.drain()
        loop.call_later(drain_answer_after(settings.drain_timeout_s), abandon_at_drain_deadline)

    def native_refuse() -> None:
        native = getattr(state, "native", None)
        if native is not None:
            native.refuse_new()

    def native_drain() -> None:
        native = getattr(state, "native", None)
        if native is not None:
            native.drain()

    def abandon_at_drain_deadline() -> None:
        answered = worker.abandon(
            f"server shutting down: the drain timeout ({settings.drain_timeout_s:g} s, "
            "BAYESGATE_DRAIN_TIMEOUT_S) expired before this request was answered"
        )
        log.warning("drain timeout: %d queued or running request(s) answered 503", answered)

    loop = asyncio.get_running_loop()
    uninstall = install_drain_handler(
        loop,
        settings.drain_delay_s,
        on_drain,
        on_stop,
        # the native front end relays some requests to this port over new connections, up to
        # when uvicorn stops (those of connections it accepted before its own drain, 0.25 s
        # earlier): refusing them earlier would answer those 502
        refuse_early=lambda: getattr(state, "native", None) is None,
        # the native port closes first, serving its accept queue while this port still takes
        # the relays of those requests (see bayesgate.service.native_bridge)
        before_end=((2 * REFUSE_LEAD_S, native_refuse), (REFUSE_LEAD_S, native_drain)),
    )
    watcher = asyncio.create_task(control.watch()) if control.shared else None
    served = worker.model
    log.info(
        "ready: model %s (sha256 %s…) on %s, score %s > %.4g flags adversarial; admin %s; "
        "event loop %s",
        served.name,
        served.sha256[:12],
        served.device,
        served.decision.score,
        served.decision.threshold,
        "enabled" if state.admin_key_digest else "disabled (no API key)",
        loop_label(loop),
    )
    return Serving(worker, watcher, uninstall)


async def shut_down(state: Any, metrics: Metrics, serving: Serving) -> None:
    """Not ready, stop the watcher and the drain handler, stop the worker (queued jobs → 503)."""
    gc.unfreeze()  # what start-up froze may be collected again (tests build many apps)
    state.ready = False
    metrics.set_ready(False)
    if serving.watcher is not None:
        serving.watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving.watcher
    if serving.uninstall_drain is not None:
        serving.uninstall_drain()
    if serving.grpc_server is not None:  # in-flight calls finish on the still-running worker
        await serving.grpc_server.stop(serving.grace_s)
    if serving.native is not None:  # likewise its accepted requests; then the rest get 503
        metrics.remove_collector(serving.native_collector)
        left = await asyncio.to_thread(serving.native.shut_down, serving.native_grace_s)
        state.native = None
        if left:
            log.warning(
                "native front end: %d request(s) still pending at the drain timeout (queued ones "
                "are answered 503)",
                left,
            )
    serving.worker.stop()
    metrics.process_exit()


async def start_grpc(app: FastAPI, settings: Settings, serving: Serving) -> None:
    """The gRPC server (:mod:`bayesgate.service.grpc_server`) when ``grpc_port`` is set; its
    port in ``app.state.grpc_port``."""
    if settings.grpc_port is None:
        return
    try:
        from bayesgate.service.grpc_server import start_grpc_server
    except ImportError as exc:
        raise StartupError(
            f"BAYESGATE_GRPC_PORT is set but gRPC is not installed ({exc}); "
            "pip install 'bayesgate[grpc]'"
        ) from None
    serving.grpc_server, app.state.grpc_port = await start_grpc_server(
        app.state, app.version, settings.host, settings.grpc_port
    )
    serving.grace_s = settings.drain_timeout_s


async def start_native(
    app: FastAPI, settings: Settings, metrics: Metrics, serving: Serving
) -> None:
    """The native front end (:mod:`bayesgate.service.native_bridge`) when ``native_port`` is
    set; its port in ``app.state.native_port``."""
    if settings.native_port is None:
        return
    from bayesgate.service.native_bridge import NativeCollector, start_native_front

    try:
        bridge = await asyncio.to_thread(start_native_front, app.state.worker, settings)
    except (OSError, ValueError) as exc:  # NativeUnavailable is a ValueError
        raise StartupError(f"BAYESGATE_NATIVE_PORT: {exc}") from None
    serving.native, app.state.native, app.state.native_port = bridge, bridge, bridge.port
    serving.native_collector = NativeCollector(bridge.front)
    serving.native_grace_s = settings.drain_timeout_s
    metrics.add_collector(serving.native_collector)


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """CPython's thread switch interval set to ``seconds`` inside, the previous one restored after.

    The worker thread releases the GIL inside every torch op and needs it back after; a thread
    waiting for the GIL asks the holder to drop it only after the switch interval (5 ms by
    default), so while the event loop runs Python the model stalls between ops. At 100 µs the
    batched server answered 21 % more images per second (issue 19, docs/performance.md)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def make_lifespan(settings: Settings, metrics: Metrics) -> Callable[[FastAPI], Any]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with switch_interval(settings.switch_interval_us / 1e6):
            try:
                async with serve(app) as running:
                    yield running
            except StartupError as exc:
                # every start-up failure the operator can fix (gRPC missing, too) is reported
                # as its one line, not a traceback (StartupMessageMiddleware); other exceptions
                # keep theirs
                if not getattr(app.state, "startup_error", None):
                    app.state.startup_error = str(exc)
                raise

    @asynccontextmanager
    async def serve(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.ready, state.draining, state.startup_error = False, False, None
        metrics.set_ready(False)
        served = await load_model(settings, state)
        state.worker = worker = start_worker(served, settings)
        state.control = control = ModelControl(worker, settings, metrics)
        control.start()
        await warm_up(worker, settings, state)
        serving = go_ready(state, settings, metrics, worker, control)
        try:
            await start_grpc(app, settings, serving)
            await start_native(app, settings, metrics, serving)
            yield
        finally:
            await shut_down(state, metrics, serving)

    return lifespan


# --- the app ----------------------------------------------------------------------------------


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the model is loaded by the lifespan, not here.

    Raises ``ValueError`` for an unreadable ``api_key_file`` and ``RuntimeError`` for a
    misconfigured ``PROMETHEUS_MULTIPROC_DIR`` (``bayesgate serve`` checks both first).
    """
    settings = settings if settings is not None else Settings()
    configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()
    admin_key = settings.admin_key()
    app = FastAPI(
        title="BayesGate",
        summary="MNIST predictions with MC-dropout uncertainty and a calibrated adversarial flag",
        version=_version(),
        lifespan=make_lifespan(settings, metrics),
        docs_url=None,  # /docs and /redoc with their files from this server: routes/api_docs.py
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs else None,
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.draining = False
    app.state.metrics = metrics
    app.state.admin_key_digest = key_digest(admin_key) if admin_key else None
    install_error_handlers(app)
    routers = api_routers(settings)
    if settings.docs:  # /docs, /redoc and their files: routes like the API's (metrics labels)
        routers = [*routers, ("", docs_router(app))]
    for prefix, router in routers:
        app.include_router(router, prefix=prefix)
    app.state.allowed_methods = AllowedMethods(route_methods(routers))
    add_middleware(app, settings, metrics, route_templates(routers))
    app.openapi = partial(openapi_with_exact_bounds, app, app.openapi)  # type: ignore[method-assign]
    return app


def openapi_with_exact_bounds(app: FastAPI, build: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """FastAPI's OpenAPI document with integer bounds as integers (built once, then cached)."""
    if app.openapi_schema is None:
        schema = build()
        exact_integer_bounds(schema)
        app.openapi_schema = schema
    return app.openapi_schema


def add_middleware(
    app: FastAPI, settings: Settings, metrics: Metrics, templates: list[str]
) -> None:
    """The lean routes (innermost: ``/v1/predict`` and ``/v2`` infer), body limit, one-line
    start-up failures, request context (outermost)."""
    lean = {
        "/v1/predict": PredictEndpoint(predict_request_model(settings)),
        "/v2/models/{name}/infer": InferEndpoint(infer_request_model(settings)),
    }
    app.add_middleware(LeanRoutes, endpoints=lean)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_header_count=settings.max_header_count,
        max_header_bytes=settings.max_header_bytes,
        body_read_timeout_s=settings.body_read_timeout_s,
    )
    app.add_middleware(StartupMessageMiddleware, state=app.state)
    app.add_middleware(
        RequestContextMiddleware,
        state=app.state,
        templates=[
            *templates,
            *(p for r in app.routes if isinstance(p := getattr(r, "path", None), str)),
        ],
        metrics=metrics,
        access_log=settings.access_log,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bayesgate")
    except PackageNotFoundError:
        return "0+unknown"
