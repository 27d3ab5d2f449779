"""Typed dependencies: the settings, the served model and its worker (from ``app.state``).

The served model has one owner, the inference worker (``app.state.worker.model``): an admin
change replaces it there, and the routes read it there.

They are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in its thread pool,
which costs a thread hand-off per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from bayesgate.service.errors import NotReady
from bayesgate.service.served_model import ServedModel
from bayesgate.service.settings import Settings
from bayesgate.service.worker import BatchWorker


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_worker(request: Request) -> BatchWorker:
    """The inference worker, once the model is loaded and warmed up."""
    if not getattr(request.app.state, "ready", False):
        raise NotReady("the model is not loaded and warmed up yet; retry shortly")
    return request.app.state.worker


async def get_served(request: Request) -> ServedModel:
    """The model the worker serves right now (an admin change may replace it at any time)."""
    return (await get_worker(request)).model


async def get_ready_served(request: Request) -> ServedModel:
    """The served model when the server takes new traffic: loaded, warmed up and not draining."""
    served = await get_served(request)
    if getattr(request.app.state, "draining", False):
        raise NotReady("the server is shutting down (draining in-flight requests)")
    return served


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServedDep = Annotated[ServedModel, Depends(get_served)]
ReadyDep = Annotated[ServedModel, Depends(get_ready_served)]
WorkerDep = Annotated[BatchWorker, Depends(get_worker)]


def default_mc_samples(settings: Settings, served: ServedModel) -> int:
    """K when a request gives none: the setting, else the K the flag's threshold was set at
    (capped at the max) — the fused detector's when it decides the flag, else
    ``calibration.json``'s (:attr:`ServedModel.basis`)."""
    if settings.default_mc_samples is not None:
        return settings.default_mc_samples
    return min(served.basis.k, settings.max_mc_samples)
