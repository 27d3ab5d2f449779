"""The lean request path: the two hot JSON/tensor routes without FastAPI's per-request machinery.

FastAPI spends more CPU per request on its own work (dependency solving, exit stacks, body
validation through the endpoint's signature, routing over every route) than these routes spend
on the image (docs/performance.md, "Where the request path's CPU goes"). :class:`LeanRoutes`, the
innermost middleware, hands ``POST /v1/predict`` and ``POST /v2/models/{name}/infer`` straight
to their :class:`LeanEndpoint`: request id, access log, HTTP metrics, header and body limits (the
middleware outside it) still apply; Starlette's exception middleware, FastAPI's exit stack and
dependency solving and the router are skipped. The body is parsed with orjson and validated by
the same typed pydantic model the FastAPI route documents (same messages).

Decoding runs on the event loop for bodies up to :data:`INLINE_DECODE_BYTES` (a few images: a
thread hand-off costs more than the work) and in a thread above it, so a large body never blocks
the loop. Domain errors become the route's error body (``/v1``: ``error``, ``detail``, ``code``;
``/v2``: ``{"error": …}``); anything else propagates to the app's outermost handler (500), as on
every route. The FastAPI routes of the same paths document the bodies in OpenAPI and, should a
request reach them, answer through the same endpoints.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from bayesgate.service.admission import hold_estimate, hold_exact_work
from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import (
    InvalidInput,
    NotReady,
    ServiceError,
    UnsupportedMediaType,
    error_response,
)
from bayesgate.service.inference_protocol import validated
from bayesgate.service.request_body import media_type, parse_json
from bayesgate.service.routes import predict as v1
from bayesgate.service.schemas import PredictRequest
from bayesgate.service.settings import Settings
from bayesgate.service.worker import BatchWorker

T = TypeVar("T")
INLINE_DECODE_BYTES = 64 * 1024  # ≈ 4 JSON images or 20 binary ones


def ready_worker(request: Request) -> BatchWorker:
    """The inference worker once the model is loaded and warmed up (503 before)."""
    state = request.app.state
    if not getattr(state, "ready", False):
        raise NotReady("the model is not loaded and warmed up yet; retry shortly")
    return state.worker


async def decode(
    request: Request,
    body: bytes,
    settings: Settings,
    worker: BatchWorker,
    work: Callable[[], T],
    passes: int | None = None,
) -> T:
    """``work()`` on the loop for a body up to :data:`INLINE_DECODE_BYTES`, in a thread above
    (:func:`~bayesgate.service.routes.predict.decode_off_loop`, bounded by the deadline); the
    request's exact image-passes (images × K) are held first either way, or refused (503) —
    without ``passes``, the queue's room is checked."""
    if len(body) <= INLINE_DECODE_BYTES:
        if passes is None:
            worker.check_room()
        else:
            hold_exact_work(request, worker, passes)
        return work()
    return await v1.decode_off_loop(request, settings, worker, work, passes=passes)


class LeanEndpoint:
    """An ASGI endpoint answering with :meth:`answer`; domain errors as the route's error body."""

    v2 = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self.answer(request)
        except ServiceError as exc:
            response = error_response(exc, v2=self.v2)
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        raise NotImplementedError


class PredictEndpoint(LeanEndpoint):
    """``POST /v1/predict`` with bodies typed as ``predict_request``."""

    def __init__(self, predict_request: type[PredictRequest]) -> None:
        self.predict_request = predict_request

    async def answer(self, request: Request) -> Response:
        if media_type(request) != "application/json":
            got = request.headers.get("content-type", "")
            raise UnsupportedMediaType(
                f"Content-Type must be application/json, got {got or 'none'} "
                "(use /v1/predict/file for uploads)"
            )
        worker = ready_worker(request)
        reservation = await hold_estimate(request, worker, takes_form=False)
        try:
            return await self.predict(request, worker)
        finally:
            worker.release(reservation)

    async def predict(self, request: Request, worker: BatchWorker) -> Response:
        settings, served = request.app.state.settings, worker.model
        body = await request.body()
        if not body:
            raise InvalidInput("body: missing (expected a JSON object)")
        predict = validated(self.predict_request, parse_json(body))
        k = predict.mc_samples
        if k is None:
            k = default_mc_samples(settings, served)
        if predict.instances is not None:
            images = len(predict.instances)
            work = partial(  # the decoders /v1's FastAPI route names (one place to replace them)
                v1.decode_instances,
                predict.instances,
                served.input_shape,
                served.input_range,
                settings.max_instances,
                source=body,  # no true/false in the text: no per-number boolean check
            )
        else:
            images = len(predict.images)
            work = partial(
                v1.decode_images, predict.images, served.input_shape, settings.max_instances
            )
        x = await decode(request, body, settings, worker, work, images * k)
        return await v1.answer(
            request, x, k, predict.seed, predict.return_samples, worker, settings
        )


class LeanRoutes:
    """Middleware: ``POST`` to a path of ``endpoints`` (templates such as
    ``/v2/models/{name}/infer``) goes straight to its endpoint, path parameters in the scope;
    every other request to the app."""

    def __init__(self, app: ASGIApp, endpoints: dict[str, Any]) -> None:
        self.app = app
        self.routes: list[tuple[re.Pattern[str], Any]] = [
            (compile_path(template)[0], endpoint) for template, endpoint in endpoints.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = get_route_path(scope)
            for regex, endpoint in self.routes:
                match = regex.match(path)
                if match is not None:
                    scope["path_params"] = match.groupdict()
                    await endpoint(scope, receive, send)
                    return
        await self.app(scope, receive, send)
