"""``POST /v1/predict`` (JSON) and ``POST /v1/predict/file`` (multipart upload of one PNG).

The bodies are typed (:func:`bayesgate.service.schemas.predict_request_model`,
:func:`~bayesgate.service.schemas.file_form_model`): FastAPI validates them strictly and documents
them; the upload's form fields are first checked as sent (:func:`check_form_fields`: decimal
integers, no empty or repeated field, ``file`` a file part), since pydantic reads form text
laxly. Admission is by work (:mod:`bayesgate.service.admission`): an estimate is held or refused
before the body is read, the exact ``images × K`` before decoding. The routes decode the images
(:mod:`bayesgate.service.inputs`) in one decoding thread within the request's deadline, hand one
job to the worker and await its answer; nothing here touches the model. The deadline counts from
the request's arrival, and a client that hangs up while waiting has its job dropped (499).
"""

# No `from __future__ import annotations`: the body types are built per app, inside
# build_router, and FastAPI reads the endpoints' annotations as objects.

import asyncio
import contextvars
import re
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Annotated, Any, TypeVar, get_args

import torch
from fastapi import APIRouter, Depends, Form, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.datastructures import FormData

from bayesgate.service.admission import AdmitByWork, hold_exact_work, reservation_of
from bayesgate.service.deps import ServedDep, SettingsDep, WorkerDep, default_mc_samples
from bayesgate.service.errors import (
    INT64,
    DeadlineExceeded,
    InvalidInput,
    integer_bounds,
)
from bayesgate.service.fast_json import json_response
from bayesgate.service.inputs import decode_images, decode_instances, decode_png
from bayesgate.service.middleware import arrived_at
from bayesgate.service.request_body import media_type, require_media_type
from bayesgate.service.schemas import (
    PredictResponse,
    error_responses,
    file_form_model,
    predict_request_model,
    predict_response,
)
from bayesgate.service.settings import Settings
from bayesgate.service.worker import BatchWorker

T = TypeVar("T")
_ERRORS = error_responses(413, 415, 422, 500, 503, 504)
JSON_ONLY = Depends(
    require_media_type("application/json", hint=" (use /v1/predict/file for uploads)")
)
FORM_ONLY = Depends(require_media_type("multipart/form-data"))


FORM_INTEGER = re.compile(r"-?[0-9]+")  # decimal, ASCII digits: not 1_0, +3, 2.0, " 3 ", "٣"
MAX_FORM_INTEGER_DIGITS = 19  # 2⁶³ − 1 has 19
FORM_BOOLEANS = ("true", "false")  # as JSON spells them: not pydantic's yes/on/1/t/…


def check_form_fields(form: FormData, model: type[BaseModel]) -> None:
    """The multipart fields of ``model`` (:class:`~bayesgate.service.schemas.FileForm`) as the
    client sent them, before pydantic's lax conversion of form text sees them:

    - a field sent twice is a 422 naming it (otherwise the last copy would silently win);
    - an empty text field is a 422 (FastAPI would take it as absent: the default);
    - an integer field is a decimal integer, digits with an optional ``-`` (Python's ``int()``,
      which pydantic follows, also takes ``1_0``, ``+3``, `` 3 `` and pydantic ``2.0``); one of
      more than 19 digits is out of range, stated with the field's range;
    - a boolean field is ``true`` or ``false`` (pydantic would also take ``yes``, ``on``, ``1``,
      ``t``, ``y`` and their opposites);
    - a file field is an uploaded file part (a part with a filename), not a text field.

    Fields the model does not have are left to its validation (``unknown field``)."""
    counts = Counter(name for name, _ in form.multi_items())
    for name, count in counts.items():
        if count > 1 and name in model.model_fields:
            raise InvalidInput(f"{name}: form field sent {count} times; send it once")
    for name, info in model.model_fields.items():
        if name not in form:
            continue
        value = form[name]
        kinds = (info.annotation, *get_args(info.annotation))
        if UploadFile in kinds:
            if isinstance(value, str):
                raise InvalidInput(
                    f"{name}: must be an uploaded file part (a form part with a filename, as "
                    f"`curl -F {name}=@digit.png` sends), got a text field"
                )
            continue
        if not isinstance(value, str):
            continue  # a file where text belongs: the model's validation says so
        if value == "":
            raise InvalidInput(f"{name}: empty value; leave the field out for the default")
        if bool in kinds:
            if value not in FORM_BOOLEANS:
                raise InvalidInput(f"{name}: expected true or false, got {value[:40]!r}")
            continue
        if int in kinds:
            if not FORM_INTEGER.fullmatch(value):
                raise InvalidInput(
                    f"{name}: expected a decimal integer (digits only), got {value[:40]!r}"
                )
            if len(value.lstrip("-")) > MAX_FORM_INTEGER_DIGITS:
                low, high = integer_bounds(model, [name])
                low = -INT64 if low is None else low
                high = INT64 - 1 if high is None else high
                raise InvalidInput(
                    f"{name}: integer out of range ({len(value.lstrip('-'))} digits); allowed "
                    f"{low} … {high}"
                )


def strict_form(model: type[BaseModel]) -> Callable[[Request], Coroutine[Any, Any, None]]:
    """Dependency: :func:`check_form_fields` on the request's form (read and cached by
    :class:`~bayesgate.service.request_body.ReadBodyFirst`), before the body's validation."""

    async def check(request: Request) -> None:
        if media_type(request) == "multipart/form-data":  # else FORM_ONLY answers 415
            check_form_fields(await request.form(), model)

    return check


async def client_gone(request: Request) -> None:
    """Returns when the client hangs up (call once the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# Decoding (base64, PNG, value checks) holds the GIL most of the time: several threads would not
# decode faster, and each would make the event loop wait longer for the GIL on every turn.
_DECODER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bayesgate-decode")


async def in_decoder(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the one decoding thread, in the caller's context (request id for logs);
    cancelled before it starts, it never runs."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(
        _DECODER, partial(context.run, fn, *args)
    )


async def decode_off_loop(
    request: Request,
    settings: Settings,
    worker: BatchWorker,
    decode: Callable[..., T],
    *args: Any,
    passes: int | None = None,
) -> T:
    """``decode(*args)`` in the decoding thread (:func:`in_decoder`), refused at once when the
    request's exact ``passes`` (images × K) do not fit the queue (without ``passes``: when the
    queue is full), 504 at the request's deadline (a decode that has not started by then never
    runs)."""
    if passes is None:
        worker.check_room()
    else:
        hold_exact_work(request, worker, passes)
    remaining = arrived_at(request.scope) + settings.request_timeout_s - time.monotonic()
    try:
        return await asyncio.wait_for(in_decoder(decode, *args), max(remaining, 0.0))
    except TimeoutError:
        worker.drop("deadline")
        raise DeadlineExceeded(
            f"no answer within the request timeout of {settings.request_timeout_s:g} s "
            "(server busy decoding)"
        ) from None


async def answer(
    request: Request,
    x: torch.Tensor,
    k: int,
    seed: int | None,
    return_samples: bool,
    worker: BatchWorker,
    settings: Settings,
) -> Response:
    """Run the job; the response names the model that computed it (from the predictions). The
    body is encoded by orjson directly (:mod:`bayesgate.service.fast_json`)."""
    predictions = await worker.predict(
        x,
        k,
        seed=seed,
        return_samples=return_samples,
        timeout_s=settings.request_timeout_s,
        arrived=arrived_at(request.scope),
        client_gone=partial(client_gone, request),
        reservation=reservation_of(request),
    )
    return json_response(predict_response(predictions, k, seed))


def build_router(settings: Settings) -> APIRouter:
    """The ``/v1`` prediction routes, with this server's limits in their body types."""
    predict_request = predict_request_model(settings)
    file_form = file_form_model(settings)
    router = APIRouter(tags=["predict"], route_class=AdmitByWork)

    @router.post(
        "/predict", response_model=PredictResponse, responses=_ERRORS, dependencies=[JSON_ONLY]
    )
    async def predict(
        request: Request,
        body: predict_request,  # type: ignore[valid-type]
        settings: SettingsDep,
        served: ServedDep,
        worker: WorkerDep,
    ) -> Response:
        """Label, probabilities, uncertainty and adversarial flag for each image of the body."""
        k = default_mc_samples(settings, served) if body.mc_samples is None else body.mc_samples
        if body.instances is not None:
            x = await decode_off_loop(
                request,
                settings,
                worker,
                decode_instances,
                body.instances,
                served.input_shape,
                served.input_range,
                settings.max_instances,
                passes=len(body.instances) * k,
            )
        else:
            x = await decode_off_loop(
                request,
                settings,
                worker,
                decode_images,
                body.images,
                served.input_shape,
                settings.max_instances,
                passes=len(body.images) * k,
            )
        return await answer(request, x, k, body.seed, body.return_samples, worker, settings)

    @router.post(
        "/predict/file",
        response_model=PredictResponse,
        responses=_ERRORS,
        dependencies=[FORM_ONLY, Depends(strict_form(file_form))],
    )
    async def predict_file(
        request: Request,
        form: Annotated[file_form, Form(media_type="multipart/form-data")],  # type: ignore[valid-type]
        settings: SettingsDep,
        served: ServedDep,
        worker: WorkerDep,
    ) -> Response:
        """Multipart upload of one PNG (field ``file``); options as form fields."""
        data = await form.file.read()
        if not data:
            raise InvalidInput("file: the uploaded file is empty")
        k = default_mc_samples(settings, served) if form.mc_samples is None else form.mc_samples
        pixels = await decode_off_loop(
            request, settings, worker, decode_png, data, "file", served.input_shape, passes=k
        )
        x = torch.from_numpy(pixels).unsqueeze(0)
        return await answer(request, x, k, form.seed, form.return_samples, worker, settings)

    return router
