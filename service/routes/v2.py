"""Open Inference Protocol (KServe v2 / Triton HTTP) routes, so standard clients work.

==========================================  ===============================================
``GET /v2``                                 server metadata: name, version, extensions
``GET /v2/health/live``                     200 ``{"live": true}`` while the loop answers
``GET /v2/health/ready``                    200 ``{"ready": true}``; 503 loading or draining
``GET /v2/models/{name}``                   model metadata: input and output tensors
``GET /v2/models/{name}/ready``             200 ``{"name", "ready": true}``; 404, 503
``GET /v2/models/{name}/config``            Triton model configuration (max batch, tensors)
``POST /v2/models/{name}/infer``            inference on JSON or binary tensors
==========================================  ===============================================

Errors are ``{"error": "<message>"}`` with 400 (any bad request), 404 (unknown model), 503 (not
ready, draining, queue full or request timeout), 500 (inference failed), and 413 for a body over
``BAYESGATE_MAX_BODY_BYTES``. Tensor coding is in :mod:`bayesgate.service.inference_protocol`; the
inference itself is the same worker job as ``/v1/predict``, so the same input, seed and K give
the same numbers on both APIs.
"""

# No `from __future__ import annotations`: the body type is built per app, inside build_router,
# and FastAPI reads the endpoints' annotations as objects.

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from bayesgate.service.deps import ReadyDep, ServedDep
from bayesgate.service.errors import InvalidInput, ModelNotFound
from bayesgate.service.inference_protocol import (
    InferRequest,
    InferResponse,
    LiveResponse,
    ModelMetadata,
    ModelReadyResponse,
    ReadyResponse,
    ServerMetadata,
    check_version,
    infer_request_model,
    model_config,
    model_metadata,
)
from bayesgate.service.request_body import ReadTensorBody, media_type
from bayesgate.service.routes.v2_infer import CONTENT_TYPES, InferEndpoint
from bayesgate.service.schemas import error_responses
from bayesgate.service.served_model import ServedModel
from bayesgate.service.settings import Settings

SERVER_NAME = "bayesgate"
# request and response "parameters" (mc_samples, seed, …); raw tensor bytes; GET …/config
EXTENSIONS = ["parameters", "binary_tensor_data", "model_configuration"]


async def named_model(name: str, served: ServedDep) -> ServedModel:
    """The served model when the path names it; 404 otherwise."""
    if name != served.name:
        raise ModelNotFound(f"unknown model {name!r}; this server serves {served.name!r}")
    return served


async def ready_named_model(name: str, served: ReadyDep) -> ServedModel:
    return await named_model(name, served)


async def json_header(request: Request) -> None:
    """400 for a Content-Type other than JSON, octet-stream (binary tensor data) or none (as
    tritonclient sends binary bodies)."""
    content_type = media_type(request)
    if content_type not in CONTENT_TYPES:
        raise InvalidInput(
            "Content-Type must be application/json, application/octet-stream (binary tensor "
            f"data) or absent, got {content_type}"
        )


NamedDep = Annotated[ServedModel, Depends(named_model)]
ReadyNamedDep = Annotated[ServedModel, Depends(ready_named_model)]


def build_router(settings: Settings) -> APIRouter:
    """The ``/v2`` routes, with this server's bound on ``mc_samples`` in the infer body type."""
    router = APIRouter(
        tags=["open inference protocol (v2)"],
        route_class=ReadTensorBody,
        strict_content_type=False,  # a body without Content-Type is JSON (as Triton reads it)
    )
    add_metadata_routes(router)
    add_config_route(router, settings.max_instances)
    add_infer_route(router, infer_request_model(settings))
    return router


def add_metadata_routes(router: APIRouter) -> None:
    """Server and model metadata, liveness and readiness."""

    @router.get("", response_model=ServerMetadata, responses=error_responses(v2=True))
    async def server_metadata(request: Request) -> dict[str, Any]:
        """Server name, version and the protocol extensions it supports."""
        return {"name": SERVER_NAME, "version": request.app.version, "extensions": EXTENSIONS}

    @router.get("/health/live", response_model=LiveResponse)
    async def live() -> dict[str, bool]:
        """Liveness: 200 as long as the event loop answers."""
        return {"live": True}

    @router.get(
        "/health/ready", response_model=ReadyResponse, responses=error_responses(503, v2=True)
    )
    async def ready(served: ReadyDep) -> dict[str, bool]:
        """Readiness: 200 once the model is loaded and warmed up; 503 before and while
        draining."""
        return {"ready": True}

    @router.get("/models/stats", include_in_schema=False)
    @router.get("/models/{name}/stats", include_in_schema=False)
    async def statistics() -> None:
        """Triton's statistics extension is not served (the server metadata does not list it):
        say so, rather than "unknown model 'stats'"."""
        raise ModelNotFound(
            "the statistics extension is not served (it is not in the server metadata's "
            "extensions): this server's counters are Prometheus metrics at GET /metrics"
        )

    @router.post("/repository/index", responses=error_responses(503, v2=True))
    async def repository_index(served: ServedDep, request: Request) -> list[dict[str, str]]:
        """The models this server holds (Triton's repository index, what tritonclient's
        ``get_model_repository_index()`` reads): one, unversioned; READY, or UNAVAILABLE while
        the server drains."""
        draining = getattr(request.app.state, "draining", False)
        return [
            {"name": served.name, "version": "", "state": "UNAVAILABLE" if draining else "READY"}
        ]

    @router.get(
        "/models/{name}",
        response_model=ModelMetadata,
        responses=error_responses(400, 404, 503, v2=True),
    )
    async def get_model_metadata(served: NamedDep) -> dict[str, Any]:
        """The model's input and output tensors (names, datatypes, shapes)."""
        return model_metadata(served)

    @router.get(
        "/models/{name}/ready",
        response_model=ModelReadyResponse,
        responses=error_responses(400, 404, 503, v2=True),
    )
    async def model_ready(served: ReadyNamedDep) -> dict[str, Any]:
        """200 when the model takes traffic; 503 while loading or draining."""
        return {"name": served.name, "ready": True}

    @router.api_route(
        "/models/{name}/versions/{version}/{rest:path}",
        methods=["GET", "POST"],
        include_in_schema=False,
    )
    @router.api_route(
        "/models/{name}/versions/{version}", methods=["GET", "POST"], include_in_schema=False
    )
    async def versioned(served: NamedDep, version: str) -> None:
        """The OIP's versioned paths: 404 naming the version (the model has none), where a bare
        "Not Found" used to answer."""
        check_version(served.name, version)


def add_config_route(router: APIRouter, max_instances: int) -> None:
    """``GET /models/{name}/config``: Triton's model configuration."""

    @router.get("/models/{name}/config", responses=error_responses(400, 404, 503, v2=True))
    async def get_model_config(served: NamedDep) -> dict[str, Any]:
        """Triton's model configuration: max batch size (instances per request), inputs,
        outputs."""
        return model_config(served, max_instances)


def add_infer_route(router: APIRouter, infer_request: type[InferRequest]) -> None:
    """``POST /models/{name}/infer`` taking ``infer_request`` bodies. Requests are served by
    :class:`~bayesgate.service.routes.v2_infer.InferEndpoint` on the app's lean path
    (:class:`~bayesgate.service.routes.lean.LeanRoutes`); this route documents the body in
    OpenAPI and answers through the same endpoint should a request reach it."""
    endpoint = InferEndpoint(infer_request)

    @router.post(
        "/models/{name}/infer",
        response_model=InferResponse,
        responses=error_responses(400, 404, 413, 500, 503, v2=True),
        dependencies=[Depends(json_header)],
    )
    async def infer(
        name: str,
        body: infer_request,  # type: ignore[valid-type]
        request: Request,
    ) -> Response:
        """Label, probabilities, uncertainty and the adversarial flag of each instance of
        ``input``."""
        return await endpoint.answer(request)
