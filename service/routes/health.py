"""``GET /healthz`` (alive), ``GET /readyz`` (ready for traffic) and ``GET /metrics``.

Readiness is 503 before the model is loaded and warmed up, and again from SIGTERM on (while the
server drains, see :mod:`bayesgate.service.shutdown`). Health and readiness need no key;
``/metrics`` is placed by ``BAYESGATE_METRICS``: ``public`` (no key, the default), ``protected``
(the admin API key, as the admin routes) or ``off`` (no route).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from bayesgate.service.auth import require_admin
from bayesgate.service.deps import ReadyDep
from bayesgate.service.schemas import ERROR_RESPONSES, error_responses
from bayesgate.service.settings import Settings


class Liveness(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    model: str
    weights_sha256: str


async def healthz() -> dict[str, str]:
    """Liveness: 200 as long as the event loop answers."""
    return {"status": "ok"}


async def readyz(served: ReadyDep) -> dict[str, Any]:
    """Readiness: 200 once the model is loaded and a warm-up batch has run; 503 before, and
    from SIGTERM on."""
    return {"status": "ready", "model": served.name, "weights_sha256": served.sha256}


async def metrics(request: Request) -> Response:
    """Prometheus metrics (text format), aggregated over all worker processes."""
    body, content_type = request.app.state.metrics.exposition()
    return Response(body, media_type=content_type)


def build_router(settings: Settings) -> APIRouter:
    router = APIRouter(tags=["health"])
    router.add_api_route("/healthz", healthz, methods=["GET"], response_model=Liveness)
    router.add_api_route(
        "/readyz",
        readyz,
        methods=["GET"],
        response_model=Readiness,
        responses={503: {**ERROR_RESPONSES[503], "description": "not loaded yet, or draining"}},
    )
    if settings.metrics != "off":
        protected = settings.metrics == "protected"
        router.add_api_route(
            "/metrics",
            metrics,
            methods=["GET"],
            response_class=Response,
            responses={
                200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
                **(error_responses(401, 403) if protected else {}),
            },
            dependencies=[Depends(require_admin)] if protected else [],
        )
    return router
