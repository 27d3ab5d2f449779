"""The protocol class of the ``/v2`` binary prototype (see ``sitecustomize.py`` beside it)."""

from __future__ import annotations

import re
import time
from typing import Any

import orjson

from bayesgate.service import httptools_protocol
from bayesgate.service.errors import ModelNotFound, ServiceError, error_body, status_of
from bayesgate.service.httptools_protocol import BoundedHttpToolsProtocol

INFER = re.compile(rb"^/v2/models/([^/?]+)/infer$")
HEADER = b"inference-header-content-length"
_INFER_MODELS: dict[int, Any] = {}  # id(settings) → its typed InferRequest model


def find_app(app: Any) -> Any:
    """The FastAPI application under uvicorn's wrappers (the one whose state has the worker)."""
    while not hasattr(getattr(app, "state", None), "settings") and hasattr(app, "app"):
        app = app.app
    return app


class FastV2Protocol(BoundedHttpToolsProtocol):
    """httptools with ``/v2`` binary infer answered in the parser callbacks."""

    _fast: list[bytes] | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._fast = None

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        if self.parser.get_method() == b"POST" and INFER.match(self.url):
            content_type = next((v for n, v in self.headers if n == b"content-type"), b"")
            if content_type in (b"", b"application/octet-stream"):
                self._awaiting_head = False
                self._head_bytes = 0
                self._fast = []
                self._keep_alive = self.parser.should_keep_alive()
                return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._fast is not None:
            self._fast.append(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._fast is None:
            super().on_message_complete()
            return
        self._awaiting_head = True
        self._head_bytes = 0
        body, self._fast = b"".join(self._fast), None
        self.flow.pause_reading()  # one request at a time on this connection, as a cycle does
        try:
            self._submit(body)
        except ServiceError as exc:
            self._fail(exc)

    def _submit(self, body: bytes) -> None:
        from bayesgate.service.deps import default_mc_samples
        from bayesgate.service.inference_protocol import decode_infer, infer_request_model

        app = find_app(self.app)
        state = app.state
        worker, settings = state.worker, state.settings
        served = worker.model
        name = INFER.match(self.url).group(1).decode()
        if name != served.name:
            raise ModelNotFound(f"unknown model {name!r}")
        header = next((v.decode() for n, v in self.headers if n == HEADER), None)
        model = _INFER_MODELS.get(id(settings))
        if model is None:  # one typed request model per settings object, as the app builds it
            model = _INFER_MODELS[id(settings)] = infer_request_model(settings)
        parsed = decode_infer(body, header, model, served, settings.max_instances)
        k = default_mc_samples(settings, served) if parsed.mc_samples is None else parsed.mc_samples
        job = worker.submit(
            parsed.x,
            k,
            seed=parsed.seed,
            return_samples=False,
            deadline=time.monotonic() + settings.request_timeout_s,
        )
        loop = self.loop
        job.future.add_done_callback(
            lambda future: loop.call_soon_threadsafe(self._answer, future, parsed, k)
        )

    def _answer(self, future: Any, parsed: Any, k: int) -> None:
        from bayesgate.service.inference_protocol import infer_response
        from bayesgate.service.oip_binary import join_body

        try:
            predictions = future.result()
        except ServiceError as exc:
            self._fail(exc)
            return
        body, length = join_body(infer_response(predictions, parsed, k), parsed.binary_outputs)
        self._write(200, body, length)

    def _fail(self, exc: ServiceError) -> None:
        body = orjson.dumps(error_body(exc.message, exc.code, v2=True))
        self._write(status_of(exc, v2=True), body, None)

    def _write(self, status: int, body: bytes, header_length: int | None) -> None:
        if self.transport.is_closing():
            return
        head = [b"HTTP/1.1 %d %s\r\n" % (status, b"OK" if status == 200 else b"Error")]
        if header_length is None:
            head.append(b"content-type: application/json\r\n")
        else:
            head.append(b"content-type: application/octet-stream\r\n")
            head.append(b"inference-header-content-length: %d\r\n" % header_length)
        head.append(b"content-length: %d\r\n" % len(body))
        if not self._keep_alive:
            head.append(b"connection: close\r\n")
        self.transport.write(b"".join(head) + b"\r\n" + body)
        if not self._keep_alive:
            self.transport.close()
            return
        self.server_state.total_requests += 1
        self.flow.resume_reading()


def install() -> None:
    """Make ``bayesgate serve``'s httptools protocol (an import string uvicorn resolves in the
    worker process) this class."""
    httptools_protocol.BoundedHttpToolsProtocol = FastV2Protocol
