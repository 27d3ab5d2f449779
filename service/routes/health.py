"""``GET /healthz`` (the process is alive) and ``GET /readyz`` (model loaded and warmed up)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.deps import ServingDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: 200 as long as the event loop answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "model not loaded/warmed up yet"}})
async def readyz(serving: ServingDep) -> dict[str, Any]:
    """Readiness: 200 once the model is loaded and a warm-up batch has run, 503 before."""
    return {"status": "ready", "model": serving.name, "weights_sha256": serving.sha256}
