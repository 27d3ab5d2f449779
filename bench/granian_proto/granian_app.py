"""The RSGI application of the granian prototype (issue 19; see ``sitecustomize.py`` beside it).

Granian parses HTTP in Rust (hyper) and calls into Python once per request with the request's
scope; :class:`GranianApp` answers ``POST /v2/models/{name}/infer`` requests without a
``Content-Type`` or with ``application/octet-stream`` (the ``/v2`` binary protocol) itself, and
hands every other request to the service's unchanged FastAPI app through a small RSGI → ASGI
bridge (:meth:`GranianApp.asgi`). The app's lifespan (model, worker, warm-up, drain handler)
runs in ``__rsgi_init__`` and ends in ``__rsgi_del__``.

The fast route does what the ``/v2`` route does, in the same order and with the same functions:
:func:`~bayesgate.service.inference_protocol.decode_infer` (the JSON header model, the tensor
checks against the card), :meth:`~bayesgate.service.worker.BatchWorker.submit`, the answer built
by ``infer_response`` and ``join_body``. Its answers are byte-identical to the service's
(``tests/service/test_granian_proto.py``). It leaves out what the fast route of
``bench/v2_fast_proto`` leaves out — the request id, access log, HTTP metrics, body limit,
admission hold before the body, client watch, the deadline's 504 body and the drain of a request
in flight at shutdown — so its CPU figure is a lower bound for a real implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Any

import orjson

from bayesgate.service.app import create_app
from bayesgate.service.deps import default_mc_samples
from bayesgate.service.errors import ModelNotFound, ServiceError, error_body, status_of
from bayesgate.service.inference_protocol import decode_infer, infer_request_model, infer_response
from bayesgate.service.oip_binary import join_body

INFER = re.compile(r"^/v2/models/([^/?]+)/infer$")
JSON_HEADERS = [("content-type", "application/json")]


class GranianApp:
    """RSGI app: ``/v2`` binary infer answered directly, everything else by the FastAPI app."""

    def __init__(self) -> None:
        self.app = create_app()
        self._stack = contextlib.AsyncExitStack()
        self._infer_model: Any = None

    # --- lifecycle (granian calls these with the worker's loop, before and after serving) ---

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        lifespan = self.app.router.lifespan_context(self.app)
        loop.run_until_complete(self._stack.enter_async_context(lifespan))
        self._infer_model = infer_request_model(self.app.state.settings)

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self._stack.aclose())

    # --- requests ---

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        if scope.method == "POST" and (match := INFER.match(scope.path)):
            content_type = scope.headers.get("content-type", "")
            if content_type in ("", "application/octet-stream"):
                await self.infer(scope, proto, match.group(1))
                return
        await self.asgi(scope, proto)

    async def infer(self, scope: Any, proto: Any, name: str) -> None:
        """``/v2`` infer with the body's binary tensor data extension."""
        body = await proto()
        state = self.app.state
        worker, settings = state.worker, state.settings
        try:
            served = worker.model
            if name != served.name:
                raise ModelNotFound(f"unknown model {name!r}")
            header = scope.headers.get("inference-header-content-length")
            parsed = decode_infer(body, header, self._infer_model, served, settings.max_instances)
            k = (
                default_mc_samples(settings, served)
                if parsed.mc_samples is None
                else parsed.mc_samples
            )
            job = worker.submit(
                parsed.x,
                k,
                seed=parsed.seed,
                return_samples=False,
                deadline=time.monotonic() + settings.request_timeout_s,
            )
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            job.future.add_done_callback(lambda _: loop.call_soon_threadsafe(done.set_result, None))
            await done
            predictions = job.future.result()
        except ServiceError as exc:
            body = orjson.dumps(error_body(exc.message, exc.code, v2=True))
            proto.response_bytes(status_of(exc, v2=True), JSON_HEADERS, body)
            return
        answer, length = join_body(infer_response(predictions, parsed, k), parsed.binary_outputs)
        if length is None:
            proto.response_bytes(200, JSON_HEADERS, answer)
            return
        headers = [
            ("content-type", "application/octet-stream"),
            ("inference-header-content-length", str(length)),
        ]
        proto.response_bytes(200, headers, answer)

    async def asgi(self, scope: Any, proto: Any) -> None:
        """One request through the FastAPI app: the RSGI scope as an ASGI one, the whole body as
        one ``http.request`` message, the response collected and sent with ``response_bytes``."""
        body = await proto()
        host, _, port = (scope.client or ":0").rpartition(":")
        asgi_scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": scope.http_version,
            "method": scope.method,
            "scheme": scope.scheme,
            "path": scope.path,
            "raw_path": scope.path.encode(),
            "query_string": scope.query_string.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in scope.headers.items()],
            "client": (host, int(port or 0)),
            "server": None,
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await proto.client_disconnect()
            return {"type": "http.disconnect"}

        status, headers, chunks = 500, [], []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(asgi_scope, receive, send)
        proto.response_bytes(status, headers, b"".join(chunks))


app = GranianApp()
