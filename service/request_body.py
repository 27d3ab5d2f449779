"""Reading request bodies: every problem with a body gets the service's own answer.

FastAPI parses a body before any dependency runs, and turns a failure it does not expect (a body
over the limit while it streams in, JSON nested too deeply, a malformed multipart form) into a
bare 400. :class:`ReadBodyFirst`, the route class of the routes that take a body, reads and
parses the body first, with the service's limits and errors:

- the body through :class:`~bayesgate.service.middleware.BodyLimitMiddleware` (413 while it
  streams in);
- JSON (when the Content-Type says JSON, or is absent on a route that allows that) with
  :func:`parse_json`: invalid JSON or JSON nested too deeply is an
  :class:`~bayesgate.service.errors.InvalidInput` naming the problem;
- a multipart form with at most :data:`MAX_FORM_FILES` file and :data:`MAX_FORM_FIELDS` fields,
  its file kept in memory (:class:`InMemoryMultiPartParser`).

FastAPI then validates the parsed body against the route's pydantic model (Starlette caches the
parsed body on the request), and :func:`require_media_type` answers a wrong Content-Type before
that validation's errors.

Before any of that, :meth:`ReadBodyFirst.admit` may refuse the request from its head alone (the
``/v1`` prediction routes hold an estimate of their work there,
:class:`bayesgate.service.admission.AdmitByWork`); what it holds is released when the route
returns, however it returns.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Coroutine
from contextlib import aclosing
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi import params as fastapi_params
from fastapi.routing import APIRoute
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.types import Message

from bayesgate.service.errors import InvalidInput, UnsupportedMediaType
from bayesgate.service.oip_binary import HEADER, split_body

MAX_FORM_FILES = 1
MAX_FORM_FIELDS = 8


def parse_json(body: bytes) -> Any:
    """The request body as JSON; :class:`InvalidInput` for invalid JSON, absurd nesting or a
    number too long to read.

    orjson parses (several times faster than ``json``); what it rejects — ``NaN``/``Infinity``
    literals, numbers beyond a double, errors — goes through ``json.loads`` so those inputs keep
    their field-level messages (``values must be finite``, ``seed``) or JSON's own error. (orjson
    reads an integer beyond 64 bits as a float; the validation says it is out of range.) An
    integer of more digits than Python converts (``sys.get_int_max_str_digits()``, 4300) is
    "number too long", not Python's advice to raise that limit."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(utf8_json_text(body))
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"body: not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidInput("body: JSON nested too deeply") from None
    except ValueError as exc:  # int(): more digits than sys.get_int_max_str_digits()
        if "digits" not in str(exc):
            raise InvalidInput(f"body: not valid JSON ({exc})") from None
        raise InvalidInput(
            f"body: number too long (an integer of more than {sys.get_int_max_str_digits()} digits)"
        ) from None


def utf8_json_text(body: bytes) -> str:
    """The body decoded as UTF-8, the only encoding JSON allows between systems (RFC 8259 §8.1);
    :class:`InvalidInput` otherwise. ``json.loads`` would guess UTF-16 or UTF-32 from the first
    bytes and read them, and such a body would bypass the byte-level checks made on the UTF-8
    text (:func:`~bayesgate.service.inputs.may_hold_booleans`). A NUL byte cannot stand in
    UTF-8 JSON (control characters are escaped inside strings, invalid outside), so it marks a
    UTF-16/32 body whose text is ASCII — which decodes as UTF-8 without error."""
    if b"\x00" in body:
        raise InvalidInput(
            "body: not valid JSON (JSON must be UTF-8, RFC 8259; this body holds NUL bytes: "
            "UTF-16 or UTF-32?)"
        )
    try:
        return body.decode("utf-8").removeprefix("\ufeff")  # a BOM may be ignored (§8.1)
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"body: not valid JSON (JSON must be UTF-8, RFC 8259; byte {exc.start}, "
            f"0x{body[exc.start]:02x}, is not UTF-8)"
        ) from None


def media_type(request: Request) -> str:
    """The Content-Type without parameters, lower case ("" when absent)."""
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def is_json(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


class InMemoryMultiPartParser(MultiPartParser):
    """Starlette's multipart parser, except that an uploaded file stays in memory whatever its
    size. Starlette writes a file over 1 MiB to a temporary file (``spool_max_size``): disk
    (``/tmp``: a 256 MiB ``emptyDir`` under ``deploy/kubernetes``) that concurrent uploads of up
    to ``BAYESGATE_MAX_BODY_BYTES`` each could fill. The body is bounded by that limit while it
    streams in (413), as a JSON body, which is held in memory too."""

    spool_max_size = sys.maxsize
    ended = False  # the closing boundary was read (python-multipart's on_end)

    def on_end(self) -> None:
        self.ended = True


async def read_form(request: Request) -> None:
    """Parse the multipart form with the service's limits (:class:`InMemoryMultiPartParser`;
    cached on the request, where Starlette's ``Request.form()`` returns it to FastAPI)."""
    if request._form is not None:
        return
    try:
        async with aclosing(request.stream()) as stream:
            parser = InMemoryMultiPartParser(
                request.headers, stream, max_files=MAX_FORM_FILES, max_fields=MAX_FORM_FIELDS
            )
            form = await parser.parse()
    except MultiPartException as exc:  # malformed, or too many files, fields or field bytes
        raise InvalidInput(f"body: unreadable multipart form ({exc.message})") from None
    if not parser.ended:  # a cut upload parses as the fields before the cut: say what it is
        await form.close()
        raise InvalidInput(
            "body: unreadable multipart form (it ends before its closing boundary: a truncated "
            "upload, or a boundary other than the Content-Type's)"
        )
    request._form = form


class ReadBodyFirst(APIRoute):
    """An ``APIRoute`` that reads and parses the body itself before FastAPI's handler runs."""

    def json_part(self, request: Request, body: bytes) -> bytes:
        """The part of the body that is JSON (all of it here; see :class:`ReadTensorBody`)."""
        return body

    def parses_as_json(self, content_type: str) -> bool:
        return is_json(content_type)

    async def admit(self, request: Request, takes_form: bool) -> Callable[[], None] | None:
        """Called before the body is read: raise a service error to refuse the request at once,
        or return a release callback run when the route is done (None: nothing held)."""
        return None

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        field = self.body_field
        takes_form = field is not None and isinstance(field.field_info, fastapi_params.Form)
        json_without_type = self.strict_content_type is False  # set per route

        async def read_first(request: Request) -> Response:
            release = await self.admit(request, takes_form)
            try:
                return await read_and_handle(request)
            finally:
                if release is not None:
                    release()

        async def read_and_handle(request: Request) -> Response:
            if field is not None:
                content_type = media_type(request)
                if takes_form:
                    if content_type == "multipart/form-data":
                        await read_form(request)
                else:
                    body = self.json_part(request, await request.body())
                    if body and (
                        self.parses_as_json(content_type)
                        or (json_without_type and not content_type)
                    ):
                        # Starlette's Request.json() returns this cached value to FastAPI.
                        request._json = parse_json(body)
            return await handler(request)

        return read_first


async def first_piece(request: Request) -> bytes:
    """The first piece of the body as it arrived (often all of it), without consuming it: the
    message is handed again to whoever reads the body next."""
    message = await request.receive()
    rest = request._receive  # Starlette's Request reads the body through this

    async def replay() -> Message:
        nonlocal message
        if message is None:
            return await rest()
        first, message = message, None
        return first

    request._receive = replay
    return message.get("body", b"") if message["type"] == "http.request" else b""


def require_media_type(expected: str, hint: str = "") -> Callable[[Request], Any]:
    """Dependency: 415 :class:`UnsupportedMediaType` unless the Content-Type is ``expected``."""

    async def check(request: Request) -> None:
        got = request.headers.get("content-type", "")
        if media_type(request) != expected:
            raise UnsupportedMediaType(
                f"Content-Type must be {expected}, got {got or 'none'}{hint}"
            )

    return check


class ReadTensorBody(ReadBodyFirst):
    """:class:`ReadBodyFirst` for the Open Inference Protocol's binary tensor extension: with an
    ``Inference-Header-Content-Length`` header only that many bytes are JSON; the rest is kept
    as ``request.state.binary_data`` (a memoryview; empty without the header)."""

    def json_part(self, request: Request, body: bytes) -> bytes:
        header, request.state.binary_data = split_body(body, request.headers.getlist(HEADER))
        return header

    def parses_as_json(self, content_type: str) -> bool:
        return is_json(content_type) or content_type == "application/octet-stream"
