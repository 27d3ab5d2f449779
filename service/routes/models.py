"""``GET /v1/models``, ``GET /v1/models/{name}`` and ``GET /v1/stats``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from bayesgate.service.deps import ServedDep, SettingsDep, WorkerDep
from bayesgate.service.errors import ModelNotFound
from bayesgate.service.schemas import ModelList, error_responses

router = APIRouter(tags=["models"])


@router.get("/models", response_model=ModelList, responses=error_responses(503))
async def list_models(served: ServedDep) -> dict[str, Any]:
    """The served model(s): card and calibration summary (threshold, target FPR, AUROCs)."""
    return {"models": [served.summary()]}


@router.get("/models/{name}", responses=error_responses(404, 422, 503))
async def get_model(name: str, served: ServedDep) -> dict[str, Any]:
    """One model's card and calibration summary."""
    if name != served.name:
        raise ModelNotFound(
            f"model {name!r} is not served here; this server serves {served.name!r}"
        )
    return served.summary()


@router.get("/stats", responses=error_responses(503))
async def stats(worker: WorkerDep, settings: SettingsDep) -> dict[str, Any]:
    """Worker statistics: requests, engine calls, observed batch sizes, queue depth and time."""
    return {
        **worker.stats.snapshot(),
        "queue_depth": worker.queue_depth(),
        "max_batch_size": settings.max_batch_size,
        "max_queue_delay_ms": settings.max_queue_delay_ms,
        "queue_capacity": settings.queue_capacity,
    }
