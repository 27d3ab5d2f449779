"""The FastAPI app factory and its lifespan.

Lifespan: load the model (store, sha256-checked) → start the inference thread → warm-up batch →
ready (metrics on, SIGTERM drain handler installed, admin watcher started when several processes
share a runtime directory) → serve → not ready → stop the worker.

``create_app()`` with no argument reads :class:`~bayesgate.service.settings.Settings` from the
environment; this is what ``bayesgate serve`` hands to uvicorn (``factory=True``), so every
uvicorn worker process builds its own app, model and inference thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from bayesgate.service.auth import key_digest
from bayesgate.service.control import ModelControl
from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import ServiceError, StartupError, install_error_handlers
from bayesgate.service.loading import ServingModel, load_serving_model
from bayesgate.service.logs import configure_logging
from bayesgate.service.metrics import Metrics
from bayesgate.service.middleware import (
    BodyLimitMiddleware,
    RequestContextMiddleware,
    StartupMessageMiddleware,
)
from bayesgate.service.routes import api_router, route_templates
from bayesgate.service.settings import Settings
from bayesgate.service.shutdown import install_drain_handler
from bayesgate.service.worker import BatchWorker, WorkerStats

log = logging.getLogger("bayesgate.service")

WARMUP_TIMEOUT_S = 120.0


async def warm_up(worker: BatchWorker, serving: ServingModel, k: int, batch: int) -> None:
    """Run one batch of blank images through the worker (first-call allocations, kernels)."""
    x = torch.zeros(batch, *serving.input_shape)
    await worker.predict(x, k, seed=0, timeout_s=WARMUP_TIMEOUT_S)
    worker.stats = WorkerStats()  # the warm-up batch is not traffic


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the model is loaded by the lifespan, not here.

    Raises ``ValueError`` for an unreadable ``api_key_file`` and ``RuntimeError`` for a
    misconfigured ``PROMETHEUS_MULTIPROC_DIR`` (``bayesgate serve`` checks both first).
    """
    settings = settings if settings is not None else Settings()
    configure_logging(settings.log_level, settings.log_format)
    metrics = Metrics()
    admin_key = settings.admin_key()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.ready, state.draining, state.startup_error = False, False, None
        metrics.set_ready(False)
        try:
            serving = await asyncio.to_thread(
                load_serving_model, settings.model_dir, settings.device
            )
        except StartupError as exc:
            state.startup_error = str(exc)
            raise
        if settings.num_threads:
            torch.set_num_threads(settings.num_threads)
        worker = BatchWorker(
            serving,
            max_batch_size=settings.max_batch_size,
            max_queue_delay_s=settings.max_queue_delay_s,
            queue_capacity=settings.queue_capacity,
        )
        worker.start()
        state.worker = worker
        state.control = control = ModelControl(state, settings, metrics)
        control.start(serving)
        try:
            k = default_mc_samples(settings, serving)
            await warm_up(worker, serving, k, min(settings.max_batch_size, settings.max_instances))
        except ServiceError as exc:
            worker.stop()
            state.startup_error = f"warm-up batch failed: {exc.message}"
            raise StartupError(state.startup_error) from exc
        worker.metrics = metrics
        state.ready = True
        metrics.set_ready(True)

        def on_drain() -> None:
            state.draining = True
            metrics.set_ready(False)

        uninstall = install_drain_handler(
            asyncio.get_running_loop(), settings.drain_delay_s, on_drain
        )
        watcher = asyncio.create_task(control.watch()) if control.shared else None
        log.info(
            "ready: model %s (sha256 %s…) on %s, score %s > %.4g flags adversarial; admin %s",
            serving.name,
            serving.sha256[:12],
            serving.device,
            serving.calibration.score,
            serving.calibration.threshold,
            "enabled" if admin_key else "disabled (no API key)",
        )
        try:
            yield
        finally:
            state.ready = False
            metrics.set_ready(False)
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if uninstall is not None:
                uninstall()
            worker.stop()
            metrics.process_exit()

    docs = settings.docs
    app = FastAPI(
        title="BayesGate",
        summary="MNIST predictions with MC-dropout uncertainty and a calibrated adversarial flag",
        version=_version(),
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    app.state.settings = settings
    app.state.ready = False
    app.state.draining = False
    app.state.metrics = metrics
    app.state.admin_key_digest = key_digest(admin_key) if admin_key else None
    install_error_handlers(app)
    app.include_router(api_router)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(StartupMessageMiddleware, state=app.state)
    app.add_middleware(
        RequestContextMiddleware,
        templates=[
            *route_templates(),
            *(p for r in app.routes if isinstance(p := getattr(r, "path", None), str)),
        ],
        metrics=metrics,
        access_log=settings.access_log,
    )
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bayesgate")
    except PackageNotFoundError:
        return "0+unknown"
