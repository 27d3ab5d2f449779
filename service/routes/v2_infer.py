"""``POST /v2/models/{name}/infer`` on a lean path: the hot route of the Open Inference Protocol
without FastAPI's per-request machinery.

FastAPI spends more CPU per request on its own work (dependency solving, exit stacks, body
validation through the endpoint's signature, routing over every route) than this route spends
on the tensor (docs/service.md, "Where the request path's CPU goes"). :class:`InferShortcut`,
the innermost middleware, hands ``POST /v2/models/{name}/infer`` straight to :class:`InferEndpoint`:
request id, access log, HTTP metrics, header and body limits (the middleware outside it) still
apply; Starlette's exception middleware, FastAPI's exit stack and the router are skipped. The
endpoint does, in order:

1. Content-Type: JSON, ``application/octet-stream`` (binary tensor extension) or none, else 400;
2. the model: 503 before the warm-up, 404 for another name;
3. room in the queue (503 + ``Retry-After`` when full), then the body;
4. decoding — split off the binary part, parse the JSON header (orjson), validate it as the typed
   :class:`~bayesgate.service.inference_protocol.InferRequest`, check the tensor against the card
   (:func:`~bayesgate.service.inference_protocol.decode_infer`): on the loop for bodies up to
   :data:`INLINE_DECODE_BYTES` (a few images: a thread hand-off costs more than the work), in a
   thread above, so a large body never blocks the event loop;
5. the job, with the deadline counted from the request's arrival and the client watched: a job
   whose client hung up or whose deadline passed before its batch ran is dropped, never computed,
   and counted in ``bayesgate_jobs_dropped_total{reason}``;
6. the answer: JSON, or the JSON header and the binary outputs after it.

Domain errors become ``{"error": …}`` with the ``/v2`` statuses here; anything else propagates to
the app's outermost handler (500 ``internal error``), as on every route. The FastAPI route of
the same path (:mod:`bayesgate.service.routes.v2`) documents the body in OpenAPI and, should a
request reach it, answers through the same endpoint.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import (
    InvalidInput,
    ModelNotFound,
    NotReady,
    ServiceError,
    error_response,
)
from bayesgate.service.inference_protocol import InferRequest, decode_infer, infer_response
from bayesgate.service.middleware import arrived_at
from bayesgate.service.oip_binary import HEADER, join_body
from bayesgate.service.request_body import media_type
from bayesgate.service.routes.predict import client_gone, decode_off_loop

PATH = "/v2/models/{name}/infer"
HEADER_NAME = "Inference-Header-Content-Length"
CONTENT_TYPES = ("", "application/json", "application/octet-stream")
INLINE_DECODE_BYTES = 64 * 1024  # ≈ 4 JSON images or 20 binary ones


class InferEndpoint:
    """The ASGI app of ``POST /v2/models/{name}/infer`` (bodies typed as ``infer_request``)."""

    def __init__(self, infer_request: type[InferRequest]) -> None:
        self.infer_request = infer_request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self.answer(request)
        except ServiceError as exc:
            response = error_response(exc, v2=True)
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        """The response to one request; a domain error is raised."""
        content_type = media_type(request)
        if content_type not in CONTENT_TYPES:
            raise InvalidInput(
                "Content-Type must be application/json, application/octet-stream (binary tensor "
                f"data) or absent, got {content_type}"
            )
        state = request.app.state
        if not getattr(state, "ready", False):
            raise NotReady("the model is not loaded and warmed up yet; retry shortly")
        settings, worker = state.settings, state.worker
        served = worker.model
        name = request.path_params["name"]
        if name != served.name:
            raise ModelNotFound(f"unknown model {name!r}; this server serves {served.name!r}")
        body = await request.body()
        decode = partial(
            decode_infer,
            body,
            request.headers.get(HEADER),
            self.infer_request,
            served,
            settings.max_instances,
        )
        if len(body) <= INLINE_DECODE_BYTES:
            worker.check_room()
            parsed = decode()
        else:
            parsed = await decode_off_loop(request, settings, worker, decode)
        k = default_mc_samples(settings, served) if parsed.mc_samples is None else parsed.mc_samples
        predictions = await worker.predict(
            parsed.x,
            k,
            seed=parsed.seed,
            timeout_s=settings.request_timeout_s,
            arrived=arrived_at(request.scope),
            client_gone=partial(client_gone, request),
        )
        return tensor_response(infer_response(predictions, parsed, k), parsed.binary_outputs)


def tensor_response(header: dict[str, Any], binary: frozenset[str]) -> Response:
    """JSON, or — when some outputs go binary — the JSON header and their bytes after it."""
    body, length = join_body(header, binary)
    if length is None:
        return Response(body, media_type="application/json")
    return Response(body, media_type="application/octet-stream", headers={HEADER_NAME: str(length)})


class InferShortcut:
    """Middleware: ``POST /v2/models/{name}/infer`` goes straight to ``endpoint``; every other
    request to the app."""

    def __init__(self, app: ASGIApp, endpoint: InferEndpoint) -> None:
        self.app = app
        self.endpoint = endpoint
        self._path: re.Pattern[str] = compile_path(PATH)[0]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = self._path.match(get_route_path(scope))
            if match is not None:
                scope["path_params"] = match.groupdict()
                await self.endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)
