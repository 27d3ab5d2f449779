"""Domain exceptions of the service and their mapping to HTTP — the only place statuses are set.

Routes, input decoding and the worker raise these; :func:`install_error_handlers` turns each into
a JSON body with the status in :data:`HTTP_STATUS`:

- native routes: ``{"error": message, "detail": message, "code": code}`` (``error`` as in the Open
  Inference Protocol, ``detail`` as in FastAPI);
- Open Inference Protocol routes (``/v2``): exactly ``{"error": message}``, with the statuses of
  :data:`V2_HTTP_STATUS` (400 for every bad request, 404 unknown model, 503 not ready or
  overloaded, 500), as KServe and Triton clients expect.
"""

from __future__ import annotations

import logging
import math
from typing import Any, get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path

log = logging.getLogger("bayesgate.service")


class ServiceError(Exception):
    """Base of every error the service reports to a client; ``code`` is a stable identifier."""

    code = "service_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(ServiceError):
    """The request body is well-formed JSON/multipart but a field is wrong (names the field)."""

    code = "invalid_input"


class TooManyInstances(InvalidInput):
    """More images in one request than ``max_instances``."""

    code = "too_many_instances"


class PayloadTooLarge(ServiceError):
    """The request body exceeds ``max_body_bytes``."""

    code = "payload_too_large"


class HeadersTooLarge(ServiceError):
    """More request headers than ``max_header_count``."""

    code = "headers_too_large"


class BodyTimeout(ServiceError):
    """The body stopped arriving for ``body_read_timeout_s`` (shorter than its Content-Length)."""

    code = "body_timeout"


class UnsupportedMediaType(ServiceError):
    """The request's Content-Type is not the one the route reads."""

    code = "unsupported_media_type"


class UnsupportedTransferCoding(ServiceError):
    """The request's ``Transfer-Encoding`` holds a coding other than ``chunked`` (RFC 9112 §6.1:
    a server that does not understand a transfer coding answers 501)."""

    code = "unsupported_transfer_coding"


class ModelNotFound(ServiceError):
    """``/v1/models/{name}`` names a model this server does not serve."""

    code = "model_not_found"


class NotReady(ServiceError):
    """The model is not loaded and warmed up yet (or the server is shutting down)."""

    code = "not_ready"


class QueueFull(ServiceError):
    """The worker's bounded queue is full: back off and retry."""

    code = "queue_full"
    retry_after_s = 1


class DeadlineExceeded(ServiceError):
    """The request was not answered within ``request_timeout_s``."""

    code = "deadline_exceeded"


class InferenceFailed(ServiceError):
    """The engine raised while running the batch holding this request."""

    code = "inference_failed"


class Unauthorized(ServiceError):
    """An admin route without a valid API key (``Authorization: Bearer`` or ``X-API-Key``)."""

    code = "unauthorized"


class AdminDisabled(ServiceError):
    """An admin route on a server started without an API key: admin is off, never open."""

    code = "admin_disabled"


class ReloadFailed(ServiceError):
    """The store's model or calibration cannot replace the served one (the old one stays)."""

    code = "reload_failed"


class DemoDisabled(ServiceError):
    """A demo-only route (``POST /v1/attack``) on a server started without ``--demo``."""

    code = "demo_disabled"


class AttackBusy(QueueFull):
    """Every attack slot (``demo_attack_concurrency``) is taken: back off and retry."""

    code = "attack_busy"


class ClientGone(ClientDisconnect):
    """The client closed the connection before its answer: nobody to answer (499 in the log)."""


class StartupError(Exception):
    """The model or its calibration cannot be served; the message names the file and problem."""


# The single exception → status table. Lookup walks the MRO, so a subclass not listed (AttackBusy)
# gets its base's status (QueueFull: 503).
HTTP_STATUS: dict[type[ServiceError], int] = {
    TooManyInstances: 413,
    InvalidInput: 422,
    PayloadTooLarge: 413,
    HeadersTooLarge: 431,
    BodyTimeout: 408,
    UnsupportedMediaType: 415,
    UnsupportedTransferCoding: 501,
    ModelNotFound: 404,
    DemoDisabled: 404,
    NotReady: 503,
    QueueFull: 503,
    DeadlineExceeded: 504,
    InferenceFailed: 500,
    Unauthorized: 401,
    AdminDisabled: 403,
    ReloadFailed: 409,
    ServiceError: 500,
}

# Open Inference Protocol statuses, where they differ: every bad request is 400, a missed deadline
# is "overloaded" (503). The body limit stays 413 (it is answered before any route runs).
V2_HTTP_STATUS: dict[type[ServiceError], int] = {
    **HTTP_STATUS,
    TooManyInstances: 400,
    InvalidInput: 400,
    UnsupportedMediaType: 400,
    DeadlineExceeded: 503,
}

V2_PREFIX = "/v2"


def is_v2_path(path: str) -> bool:
    """True for the Open Inference Protocol routes (``/v2`` and below)."""
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")


def status_of(exc: ServiceError, *, v2: bool = False) -> int:
    """HTTP status of a domain error (the first class of its MRO found in the status table)."""
    table = V2_HTTP_STATUS if v2 else HTTP_STATUS
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return 500


def error_body(message: str, code: str, *, v2: bool = False, **extra: Any) -> dict[str, Any]:
    if v2:
        return {"error": message}
    return {"error": message, "detail": message, "code": code, **extra}


def error_response(exc: ServiceError, *, v2: bool = False) -> JSONResponse:
    """The HTTP response of a domain error (also used by the body-size middleware)."""
    status = status_of(exc, v2=v2)
    headers: dict[str, str] = {}
    if isinstance(exc, QueueFull):
        headers["Retry-After"] = str(exc.retry_after_s)
    if isinstance(exc, (BodyTimeout, HeadersTooLarge, PayloadTooLarge)):
        # the rest of the request is not read: do not reuse the connection (nor wait for a body
        # that is not wanted: the server half-closes and lingers, lingering_close.py)
        headers["Connection"] = "close"
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="bayesgate-admin"'
    if status >= 500:
        log.warning("%s %d: %s", exc.code, status, exc.message)
    return JSONResponse(
        error_body(exc.message, exc.code, v2=v2), status_code=status, headers=headers or None
    )


_LOCATIONS = ("body", "query", "path", "form")  # where FastAPI found a value, not a field


def _location(loc: tuple[Any, ...]) -> str:
    """``("body", "instances", 0)`` → ``instances[0]``."""
    parts = [str(p) for p in loc if p not in _LOCATIONS]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "body"


_SCALARS = (str, int, float, bool, type(None))


def _describe(error: dict[str, Any]) -> str:
    """One pydantic/FastAPI error → ``"<field>: <message>"``, with the offending value when it
    is a short scalar."""
    loc, kind = tuple(error.get("loc", ())), error.get("type", "")
    message = error.get("msg", "invalid")
    if kind == "json_invalid":  # FastAPI's own JSON parsing (a route without ReadBodyFirst)
        return f"body: not valid JSON ({error.get('ctx', {}).get('error', message)})"
    if kind in ("model_type", "model_attributes_type", "dict_type") and len(loc) <= 1:
        return "body: expected a JSON object"
    if kind == "extra_forbidden":  # name the unknown field at its parent
        return f"{_location(loc[:-1])}: unknown field {str(loc[-1])!r}"
    value = error.get("input")
    if kind not in ("missing", "one_input", "int_out_of_range") and isinstance(value, _SCALARS):
        shown = repr(value)
        if len(shown) <= 40:
            message = f"{message} (got {shown})"
    return f"{_location(loc)}: {message}"


INT64 = 2**63


def out_of_range(model: type[BaseModel] | None, error: dict[str, Any]) -> dict[str, Any]:
    """``error`` as an out-of-range error when an integer field got a whole number beyond 64
    bits: orjson parses such an integer (``18446744073709551616``) as a float, which the strict
    field then calls "not a valid integer". The message gives the field's range, read from
    ``model`` (:func:`integer_bounds`)."""
    value = error.get("input")
    if error.get("type") != "int_type" or not isinstance(value, float):
        return error
    if not (math.isfinite(value) and value.is_integer() and abs(value) >= INT64):
        return error
    message = f"integer out of range: got {value:.6g}, beyond 64 bits"
    if model is not None:
        path = [p for p in error.get("loc", ()) if isinstance(p, str) and p not in _LOCATIONS]
        low, high = integer_bounds(model, path)
        message += (
            f"; allowed {-INT64 if low is None else low} … {INT64 - 1 if high is None else high}"
        )
    return {**error, "type": "int_out_of_range", "msg": message}


def integer_bounds(model: type[BaseModel], path: list[str]) -> tuple[int | None, int | None]:
    """``(ge, le)`` of the field at ``path`` (names through nested models), None when unknown."""
    node: Any = model
    low = high = None
    for i, name in enumerate(path):
        fields = getattr(node, "model_fields", {})
        if name not in fields:
            return None, None
        info = fields[name]
        if i == len(path) - 1:
            for item in info.metadata:
                low = getattr(item, "ge", low)
                high = getattr(item, "le", high)
            return low, high
        node = next(
            (a for a in (info.annotation, *get_args(info.annotation)) if _is_model(a)), None
        )
    return low, high


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def describe_validation_errors(errors: list[Any], limit: int = 5) -> str:
    """pydantic/FastAPI error list → ``"mc_samples: Input should be a valid integer (got '5');
    seed: …"``."""
    parts = [_describe(e) for e in errors]
    more = f" (and {len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


class AllowedMethods:
    """Path → every method the API's routes take there, for a 405's ``Allow`` header (Starlette
    names only the first matching route's methods, and two routes may share a path)."""

    def __init__(self, routes: list[tuple[str, set[str]]]) -> None:
        self._patterns = [(compile_path(template)[0], methods) for template, methods in routes]

    def __call__(self, path: str) -> list[str]:
        found: set[str] = set()
        for regex, methods in self._patterns:
            if regex.match(path):
                found |= methods
        return sorted(found)


def install_error_handlers(app: FastAPI) -> None:
    """Map domain errors, FastAPI's own validation errors and HTTP errors to JSON bodies."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc, v2=is_v2_path(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message = describe_validation_errors([out_of_range(None, e) for e in exc.errors()])
        return error_response(InvalidInput(message), v2=is_v2_path(request.url.path))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(getattr(exc, "headers", None) or {})
        allowed = getattr(request.app.state, "allowed_methods", None)
        if (
            exc.status_code == 405
            and allowed is not None
            and (methods := allowed(request.url.path))
        ):
            headers["Allow"] = ", ".join(methods)
        return JSONResponse(
            error_body(str(exc.detail), "http_error", v2=is_v2_path(request.url.path)),
            status_code=exc.status_code,
            headers=headers or None,
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette's outermost middleware sends this, then re-raises so the server logs it.
        message = f"internal error: {type(exc).__name__}"
        return JSONResponse(
            error_body(message, "internal_error", v2=is_v2_path(request.url.path)),
            status_code=500,
        )
