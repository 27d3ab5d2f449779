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

from bayesgate.service.deps import ReadyDep, ServingDep, SettingsDep, WorkerDep
from bayesgate.service.errors import InvalidInput, ModelNotFound
from bayesgate.service.inference_protocol import (
    InferRequest,
    InferResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    encode_outputs,
    model_metadata,
    parse_infer_request,
)
from bayesgate.service.loading import ServingModel
from bayesgate.service.routes.predict import parse_json, resolve_k
from bayesgate.service.schemas import error_responses

router = APIRouter(tags=["open inference protocol (v2)"])

SERVER_NAME = "bayesgate"
EXTENSIONS = ["parameters"]  # request and response "parameters" (mc_samples, seed, …)


def _check_name(name: str, serving: ServingModel) -> None:
    if name != serving.name:
        raise ModelNotFound(f"unknown model {name!r}; this server serves {serving.name!r}")


@router.get("", response_model=ServerMetadata, responses=error_responses(v2=True))
async def server_metadata(request: Request) -> dict[str, Any]:
    """Server name, version and the protocol extensions it supports."""
    return {"name": SERVER_NAME, "version": request.app.version, "extensions": EXTENSIONS}


@router.get("/health/live", response_model=LiveResponse)
async def live() -> dict[str, bool]:
    """Liveness: 200 as long as the event loop answers."""
    return {"live": True}


@router.get("/health/ready", response_model=ReadyResponse, responses=error_responses(503, v2=True))
async def ready(serving: ReadyDep) -> dict[str, bool]:
    """Readiness: 200 once the model is loaded and warmed up; 503 before and while draining."""
    return {"ready": True}


@router.get(
    "/models/{name}",
    response_model=ModelMetadata,
    responses=error_responses(400, 404, 503, v2=True),
)
async def get_model_metadata(name: str, serving: ServingDep) -> dict[str, Any]:
    """The model's input and output tensors (names, datatypes, shapes)."""
    _check_name(name, serving)
    return model_metadata(serving)


@router.get(
    "/models/{name}/ready",
    response_model=ModelReadyResponse,
    responses=error_responses(400, 404, 503, v2=True),
)
async def model_ready(name: str, serving: ReadyDep) -> dict[str, Any]:
    """200 when the model takes traffic; 503 while loading or draining."""
    _check_name(name, serving)
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
    serving: ServingDep,
    worker: WorkerDep,
) -> JSONResponse:
    """Label, probabilities, uncertainty and the adversarial flag of each instance of ``input``."""
    _check_name(name, serving)
    if "inference-header-content-length" in request.headers:
        raise InvalidInput(
            "binary tensor data is not supported by this server; send JSON tensors "
            "(tritonclient: binary_data=False)"
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type not in ("", "application/json"):
        raise InvalidInput(f"Content-Type must be application/json (or absent), got {content_type}")
    parsed = parse_infer_request(parse_json(await request.body()), serving, settings.max_instances)
    k = resolve_k(parsed.mc_samples, settings, serving)
    predictions = await worker.predict(
        parsed.x, k, seed=parsed.seed, timeout_s=settings.request_timeout_s
    )
    # The answer's threshold and score are those the worker used (an admin change may land
    # between the request's start and its batch).
    first = predictions[0]
    parameters: dict[str, Any] = {
        "mc_samples": k,
        "calibration_mc_samples": serving.calibration.k,
        "score_name": first["score_name"],
        "threshold": first["threshold"],
        "weights_sha256": serving.sha256,
    }
    if parsed.seed is not None:
        parameters["seed"] = parsed.seed
    body: dict[str, Any] = {"model_name": serving.name}
    if parsed.request_id is not None:
        body["id"] = parsed.request_id
    body["parameters"] = parameters
    body["outputs"] = encode_outputs(predictions, parsed.outputs, len(serving.card.classes))
    return JSONResponse(body)
