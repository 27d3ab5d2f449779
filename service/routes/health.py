"""``GET /healthz`` (alive), ``GET /readyz`` (ready for traffic) and ``GET /metrics``.

Readiness is 503 before the model is loaded and warmed up, and again from SIGTERM on (while the
server drains, see :mod:`bayesgate.service.shutdown`). None of these routes needs a key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel

from bayesgate.service.deps import ReadyDep
from bayesgate.service.schemas import ERROR_RESPONSES

router = APIRouter(tags=["health"])


class Liveness(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    model: str
    weights_sha256: str


@router.get("/healthz", response_model=Liveness)
async def healthz() -> dict[str, str]:
    """Liveness: 200 as long as the event loop answers."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {**ERROR_RESPONSES[503], "description": "not loaded yet, or draining"}},
)
async def readyz(served: ReadyDep) -> dict[str, Any]:
    """Readiness: 200 once the model is loaded and a warm-up batch has run; 503 before, and
    from SIGTERM on."""
    return {"status": "ready", "model": served.name, "weights_sha256": served.sha256}


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics (text format), aggregated over all worker processes."""
    body, content_type = request.app.state.metrics.exposition()
    return Response(body, media_type=content_type)
