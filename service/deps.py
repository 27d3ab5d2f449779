"""Typed dependencies: the settings, the served model and its worker (from ``app.state``).

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in its thread pool,
which costs a thread hand-off per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from bayesgate.service.errors import NotReady
from bayesgate.service.loading import ServingModel
from bayesgate.service.settings import Settings
from bayesgate.service.worker import BatchWorker


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_serving(request: Request) -> ServingModel:
    if not getattr(request.app.state, "ready", False):
        raise NotReady("the model is not loaded and warmed up yet; retry shortly")
    return request.app.state.serving


async def get_ready_serving(request: Request) -> ServingModel:
    """The served model when the server takes new traffic: loaded, warmed up and not draining."""
    serving = await get_serving(request)
    if getattr(request.app.state, "draining", False):
        raise NotReady("the server is shutting down (draining in-flight requests)")
    return serving


async def get_worker(request: Request) -> BatchWorker:
    await get_serving(request)
    return request.app.state.worker


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServingDep = Annotated[ServingModel, Depends(get_serving)]
ReadyDep = Annotated[ServingModel, Depends(get_ready_serving)]
WorkerDep = Annotated[BatchWorker, Depends(get_worker)]


def default_mc_samples(settings: Settings, serving: ServingModel) -> int:
    """K when a request gives none: the setting, else the calibration's K (capped at the max)."""
    if settings.default_mc_samples is not None:
        return settings.default_mc_samples
    return min(serving.calibration.k, settings.max_mc_samples)
