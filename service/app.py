"""The FastAPI app factory and its lifespan (load → warm up → ready → serve → stop worker).

``create_app()`` with no argument reads :class:`~service.settings.Settings` from the
environment; this is what ``bayesgate serve`` hands to uvicorn (``factory=True``), so every
uvicorn worker process builds its own app, model and inference thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import torch
from fastapi import FastAPI

from service.deps import default_mc_samples
from service.errors import ServiceError, StartupError, install_error_handlers
from service.loading import ServingModel, load_serving_model
from service.middleware import BodyLimitMiddleware, StartupMessageMiddleware
from service.routes import api_router
from service.settings import Settings
from service.worker import BatchWorker, WorkerStats

log = logging.getLogger("bayesgate.service")

WARMUP_TIMEOUT_S = 120.0


async def warm_up(worker: BatchWorker, serving: ServingModel, k: int, batch: int) -> None:
    """Run one batch of blank images through the worker (first-call allocations, kernels)."""
    x = torch.zeros(batch, *serving.input_shape)
    await worker.predict(x, k, seed=0, timeout_s=WARMUP_TIMEOUT_S)
    worker.stats = WorkerStats()  # the warm-up batch is not traffic


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the model is loaded by the lifespan, not here."""
    settings = settings if settings is not None else Settings()
    _configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = False
        app.state.startup_error = None
        try:
            serving = await asyncio.to_thread(
                load_serving_model, settings.model_dir, settings.device
            )
        except StartupError as exc:
            app.state.startup_error = str(exc)
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
        app.state.serving, app.state.worker = serving, worker
        try:
            k = default_mc_samples(settings, serving)
            await warm_up(worker, serving, k, min(settings.max_batch_size, settings.max_instances))
        except ServiceError as exc:
            worker.stop()
            app.state.startup_error = f"warm-up batch failed: {exc.message}"
            raise StartupError(app.state.startup_error) from exc
        app.state.ready = True
        log.info(
            "ready: model %s (sha256 %s…) on %s, score %s > %.4g flags adversarial",
            serving.name,
            serving.sha256[:12],
            serving.device,
            serving.calibration.score,
            serving.calibration.threshold,
        )
        try:
            yield
        finally:
            app.state.ready = False
            worker.stop()

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
    install_error_handlers(app)
    app.include_router(api_router)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    app.add_middleware(StartupMessageMiddleware, state=app.state)
    return app


def _configure_logging(level: str) -> None:
    """Send the ``bayesgate`` loggers to stderr in uvicorn's format (once per process)."""
    logger = logging.getLogger("bayesgate")
    logger.setLevel("DEBUG" if level == "trace" else level.upper())
    if any(getattr(h, "bayesgate_handler", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    try:
        from uvicorn.logging import DefaultFormatter

        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
    except ImportError:  # pragma: no cover - uvicorn is a dependency
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.bayesgate_handler = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bayesgate")
    except PackageNotFoundError:
        return "0+unknown"
