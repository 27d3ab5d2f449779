"""``POST /v2/models/{name}/infer`` on the lean path (:mod:`bayesgate.service.routes.lean`):
the hot route of the Open Inference Protocol without FastAPI's per-request machinery.

:class:`InferEndpoint` does, in order:

1. Content-Type: JSON, ``application/octet-stream`` (binary tensor extension) or none, else 400;
2. the model: 503 before the warm-up, 404 for another name;
3. the body, then room in the queue (503 + ``Retry-After`` when full);
4. decoding — split off the binary part, parse the JSON header (orjson), validate it as the typed
   :class:`~bayesgate.service.inference_protocol.InferRequest`, check the tensor against the card
   (:func:`~bayesgate.service.inference_protocol.decode_infer`): on the loop for small bodies, in
   a thread for large ones (:func:`~bayesgate.service.routes.lean.decode`);
5. the job, with the deadline counted from the request's arrival and the client watched: a job
   whose client hung up or whose deadline passed before its batch ran is dropped, never computed,
   and counted in ``bayesgate_jobs_dropped_total{reason}``;
6. the answer: JSON, or the JSON header and the binary outputs after it.

Errors are ``{"error": …}`` with the ``/v2`` statuses.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import (
    InvalidInput,
    ModelNotFound,
)
from bayesgate.service.inference_protocol import InferRequest, decode_infer, infer_response
from bayesgate.service.middleware import arrived_at
from bayesgate.service.oip_binary import HEADER, HEADER_NAME, join_body
from bayesgate.service.request_body import media_type
from bayesgate.service.routes.lean import LeanEndpoint, decode, ready_worker
from bayesgate.service.routes.predict import client_gone

CONTENT_TYPES = ("", "application/json", "application/octet-stream")


class InferEndpoint(LeanEndpoint):
    """``POST /v2/models/{name}/infer`` with bodies typed as ``infer_request``."""

    v2 = True

    def __init__(self, infer_request: type[InferRequest]) -> None:
        self.infer_request = infer_request

    async def answer(self, request: Request) -> Response:
        """The response to one request; a domain error is raised."""
        content_type = media_type(request)
        if content_type not in CONTENT_TYPES:
            raise InvalidInput(
                "Content-Type must be application/json, application/octet-stream (binary tensor "
                f"data) or absent, got {content_type}"
            )
        worker = ready_worker(request)
        settings, served = request.app.state.settings, worker.model
        name = request.path_params["name"]
        if name != served.name:
            raise ModelNotFound(f"unknown model {name!r}; this server serves {served.name!r}")
        body = await request.body()
        work = partial(
            decode_infer,
            body,
            request.headers.getlist(HEADER),  # every copy: two that disagree are a 400
            self.infer_request,
            served,
            settings.max_instances,
        )
        parsed = await decode(request, body, settings, worker, work)
        k = default_mc_samples(settings, served) if parsed.mc_samples is None else parsed.mc_samples
        predictions = await worker.predict(
            parsed.x,
            k,
            seed=parsed.seed,
            timeout_s=parsed.timeout_s(settings.request_timeout_s),
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
