"""Open Inference Protocol (KServe v2 / Triton HTTP) routes, so standard clients work.

==========================================  ===============================================
``GET /v2``                                 server metadata: name, version, extensions
``GET /v2/health/live``                     200 ``{"live": true}`` while the loop answers
``GET /v2/health/ready``                    200 ``{"ready": true}``; 503 loading or draining
``GET /v2/models/{name}``                   model metadata: input and output tensors
``GET /v2/models/{name}/ready``             200 ``{"name", "ready": true}``; 404, 503
``POST /v2/models/{name}/infer``            inference on JSON tensors
==========================================  ===============================================

Errors are ``{"error": "<message>"}`` with 400 (any bad request), 404 (unknown model), 503 (not
ready, draining, queue full or request timeout), 500 (inference failed), and 413 for a body over
``BAYESGATE_MAX_BODY_BYTES``. Tensor coding is in :mod:`bayesgate.service.inference_protocol`; the
inference itself is the same worker job as ``/v1/predict``, so the same input, seed and K give
the same numbers on both APIs.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from bayesgate.service.deps import ReadyDep, ServedDep, SettingsDep, WorkerDep, mc_samples_for
from bayesgate.service.errors import InvalidInput, ModelNotFound
from bayesgate.service.inference_protocol import (
    InferRequest,
    InferResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    infer_response,
    model_metadata,
    parse_infer_request,
)
from bayesgate.service.inputs import parse_json
from bayesgate.service.schemas import error_responses
from bayesgate.service.served_model import ServedModel

router = APIRouter(tags=["open inference protocol (v2)"])

SERVER_NAME = "bayesgate"
EXTENSIONS = ["parameters"]  # request and response "parameters" (mc_samples, seed, …)


def _check_name(name: str, served: ServedModel) -> None:
    if name != served.name:
        raise ModelNotFound(f"unknown model {name!r}; this server serves {served.name!r}")


@router.get("", response_model=ServerMetadata, responses=error_responses(v2=True))
async def server_metadata(request: Request) -> dict[str, Any]:
    """Server name, version and the protocol extensions it supports."""
    return {"name": SERVER_NAME, "version": request.app.version, "extensions": EXTENSIONS}


@router.get("/health/live", response_model=LiveResponse)
async def live() -> dict[str, bool]:
    """Liveness: 200 as long as the event loop answers."""
    return {"live": True}


@router.get("/health/ready", response_model=ReadyResponse, responses=error_responses(503, v2=True))
async def ready(served: ReadyDep) -> dict[str, bool]:
    """Readiness: 200 once the model is loaded and warmed up; 503 before and while draining."""
    return {"ready": True}


@router.get(
    "/models/{name}",
    response_model=ModelMetadata,
    responses=error_responses(400, 404, 503, v2=True),
)
async def get_model_metadata(name: str, served: ServedDep) -> dict[str, Any]:
    """The model's input and output tensors (names, datatypes, shapes)."""
    _check_name(name, served)
    return model_metadata(served)


@router.get(
    "/models/{name}/ready",
    response_model=ModelReadyResponse,
    responses=error_responses(400, 404, 503, v2=True),
)
async def model_ready(name: str, served: ReadyDep) -> dict[str, Any]:
    """200 when the model takes traffic; 503 while loading or draining."""
    _check_name(name, served)
    return {"name": name, "ready": True}


@router.post(
    "/models/{name}/infer",
    response_model=InferResponse,
    responses=error_responses(400, 404, 413, 500, 503, v2=True),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": InferRequest.model_json_schema()}},
        }
    },
)
async def infer(
    name: str,
    request: Request,
    settings: SettingsDep,
    served: ServedDep,
    worker: WorkerDep,
) -> JSONResponse:
    """Label, probabilities, uncertainty and the adversarial flag of each instance of ``input``."""
    _check_name(name, served)
    if "inference-header-content-length" in request.headers:
        raise InvalidInput(
            "binary tensor data is not supported by this server; send JSON tensors "
            "(tritonclient: binary_data=False)"
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ("", "application/json"):
        raise InvalidInput(f"Content-Type must be application/json (or absent), got {content_type}")
    parsed = parse_infer_request(parse_json(await request.body()), served, settings.max_instances)
    k = mc_samples_for(parsed.mc_samples, settings, served)
    predictions = await worker.predict(
        parsed.x, k, seed=parsed.seed, timeout_s=settings.request_timeout_s
    )
    return JSONResponse(infer_response(predictions, parsed, k))
