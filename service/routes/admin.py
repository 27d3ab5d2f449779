"""Admin routes (API key required, see :mod:`bayesgate.service.auth`); changes apply to every
worker process.

=============================  ==============================================================
``POST /admin/reload``         read the model and calibration.json again from
                               ``BAYESGATE_MODEL_DIR`` (sha256-checked); drops any override
``PUT /admin/threshold``       ``{"score": …, "threshold": …}`` (either or both): flag inputs by
                               ``score > threshold`` instead of calibration.json's decision
``DELETE /admin/threshold``    back to calibration.json's score and threshold
=============================  ==============================================================

No route takes a model file, a path or a URL: the model comes only from the configured store.
What a change does is in :mod:`bayesgate.service.control`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from bayesgate.service.auth import refuse_unless_admin, require_admin
from bayesgate.service.control import AdminState, ModelControl
from bayesgate.service.deps import ServedDep
from bayesgate.service.errors import InvalidInput
from bayesgate.service.request_body import ReadBodyFirst, require_media_type
from bayesgate.service.schemas import error_responses


class AdminRoute(ReadBodyFirst):
    """Reads and parses the body itself (:class:`ReadBodyFirst`), but only after the key check:
    an anonymous caller gets 401/403, never a parser's message about the body it sent, and its
    body (up to ``BAYESGATE_MAX_BODY_BYTES``) is not read."""

    async def admit(self, request: Request, takes_form: bool) -> Callable[[], None] | None:
        await refuse_unless_admin(request)
        return None


router = APIRouter(
    prefix="/admin",
    tags=["admin"],
    dependencies=[Depends(require_admin)],  # the OpenAPI security schemes; checked again, cheaply
    responses=error_responses(401, 403, 422, 503),
    route_class=AdminRoute,
)
# A JSON object sent as text/plain (or without a type) is refused by its Content-Type (415), not
# called "not a JSON object"; after the key check, so an anonymous caller still gets 401/403.
JSON_ONLY = Depends(require_media_type("application/json"))


class ThresholdRequest(BaseModel):
    """``PUT /admin/threshold``: at least one of the two."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"anyOf": [{"required": ["score"]}, {"required": ["threshold"]}]},
    )

    score: str | None = Field(
        None,
        description="predictive_entropy, mutual_information, variation_ratio, or with a fused "
        "detector any of its scores (fused, mahalanobis_<layer>, neg_log_kde, …)",
    )
    threshold: float | None = Field(
        None, allow_inf_nan=False, description="flag when score > threshold"
    )


class AdminResult(BaseModel):
    """The model and decision now served."""

    model: str
    weights_sha256: str
    score: str
    threshold: float
    override: dict[str, Any] | None
    generation: int = Field(description="count of admin changes since start")
    scope: str = Field(description="which processes the change reaches")


def _control(request: Request) -> ModelControl:
    return request.app.state.control


def _result(request: Request, state: AdminState) -> dict[str, Any]:
    control = _control(request)
    served = control.worker.model
    return {
        "model": served.name,
        "weights_sha256": served.sha256,
        "score": served.decision.score,
        "threshold": served.decision.threshold,
        "override": None if served.override is None else asdict(served.override),
        "generation": state.generation,
        "scope": "all worker processes (others within 1 s)" if control.shared else "this process",
    }


@router.post("/reload", response_model=AdminResult, responses=error_responses(409))
async def reload(request: Request, _: ServedDep) -> dict[str, Any]:
    """Reload the model and its calibration from the configured model directory (no body)."""
    if await request.body():
        raise InvalidInput(
            "body: this route takes no body; it reloads from the configured BAYESGATE_MODEL_DIR"
        )
    state = await _control(request).reload_state()
    return _result(request, state)


@router.put(
    "/threshold",
    response_model=AdminResult,
    responses=error_responses(415),
    dependencies=[JSON_ONLY],
)
async def set_threshold(body: ThresholdRequest, request: Request, _: ServedDep) -> dict[str, Any]:
    """Flag inputs by ``score > threshold``; a missing score keeps the active one, a missing
    threshold takes calibration.json's for that score."""
    state = await _control(request).set_decision(body.score, body.threshold)
    return _result(request, state)


@router.delete("/threshold", response_model=AdminResult)
async def clear_threshold(request: Request, _: ServedDep) -> dict[str, Any]:
    """Back to calibration.json's score and threshold."""
    state = await _control(request).clear_decision()
    return _result(request, state)
