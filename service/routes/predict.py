"""``POST /v1/predict`` (JSON) and ``POST /v1/predict/file`` (multipart upload of one PNG).

Both decode and validate the input first (:mod:`bayesgate.service.inputs`), then hand one job to the
worker and await its answer; nothing here touches the model.
"""

from __future__ import annotations

import torch
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from bayesgate.service.deps import ServedDep, SettingsDep, WorkerDep, mc_samples_for
from bayesgate.service.errors import InvalidInput, UnsupportedMediaType, describe_validation_errors
from bayesgate.service.inputs import decode_images, decode_instances, decode_png, parse_json
from bayesgate.service.schemas import (
    MAX_SEED,
    PredictRequest,
    PredictResponse,
    error_responses,
    predict_response,
)
from bayesgate.service.settings import Settings

router = APIRouter(tags=["predict"])

_ERRORS = error_responses(413, 415, 422, 500, 503, 504)


class FileOptions(BaseModel):
    """Form fields of ``/v1/predict/file`` besides ``file``."""

    model_config = ConfigDict(extra="forbid")

    mc_samples: int | None = None
    return_samples: bool = False
    seed: int | None = Field(None, ge=0, le=MAX_SEED)


def _require_media_type(request: Request, expected: str) -> None:
    got = request.headers.get("content-type", "")
    if got.split(";")[0].strip().lower() != expected:
        raise UnsupportedMediaType(
            f"Content-Type must be {expected}, got {got or 'none'}"
            + (" (use /v1/predict/file for uploads)" if expected == "application/json" else "")
        )


async def _answer(
    x: torch.Tensor,
    k: int,
    seed: int | None,
    return_samples: bool,
    worker: WorkerDep,
    settings: Settings,
) -> PredictResponse:
    predictions = await worker.predict(
        x, k, seed=seed, return_samples=return_samples, timeout_s=settings.request_timeout_s
    )
    return predict_response(predictions, k, seed)


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": PredictRequest.model_json_schema()}},
        }
    },
)
async def predict(
    request: Request, settings: SettingsDep, served: ServedDep, worker: WorkerDep
) -> PredictResponse:
    """Label, probabilities, uncertainty and adversarial flag for each image of the body."""
    _require_media_type(request, "application/json")
    payload = parse_json(await request.body())
    if not isinstance(payload, dict):
        raise InvalidInput("body: expected a JSON object with 'instances' or 'images'")
    try:
        req = PredictRequest.model_validate(payload)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_errors(exc.errors())) from None
    if (req.instances is None) == (req.images is None):
        raise InvalidInput(
            "body: give exactly one of 'instances' (arrays) or 'images' (base64 PNG)"
        )
    k = mc_samples_for(req.mc_samples, settings, served)
    if req.instances is not None:
        x = decode_instances(
            req.instances, served.input_shape, served.input_range, settings.max_instances
        )
    else:
        x = decode_images(req.images or [], served.input_shape, settings.max_instances)
    return await _answer(x, k, req.seed, req.return_samples, worker, settings)


@router.post(
    "/predict/file",
    response_model=PredictResponse,
    responses=_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file"],
                        "properties": {
                            "file": {"type": "string", "format": "binary"},
                            "mc_samples": {"type": "integer"},
                            "return_samples": {"type": "boolean"},
                            "seed": {"type": "integer"},
                        },
                    }
                }
            },
        }
    },
)
async def predict_file(
    request: Request, settings: SettingsDep, served: ServedDep, worker: WorkerDep
) -> PredictResponse:
    """Multipart upload of one PNG (field ``file``); options as form fields."""
    _require_media_type(request, "multipart/form-data")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except StarletteHTTPException as exc:  # Starlette's multipart parser: malformed or too big
        raise InvalidInput(f"body: unreadable multipart form ({exc.detail})") from None
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInput("file: expected one uploaded PNG file in the form field 'file'")
        options = {key: value for key, value in form.items() if key != "file"}
        try:
            opts = FileOptions.model_validate(options)
        except ValidationError as exc:
            raise InvalidInput(describe_validation_errors(exc.errors())) from None
        data = await upload.read()
    finally:
        await form.close()
    if not data:
        raise InvalidInput("file: the uploaded file is empty")
    k = mc_samples_for(opts.mc_samples, settings, served)
    x = torch.from_numpy(decode_png(data, "file", served.input_shape)).unsqueeze(0)
    return await _answer(x, k, opts.seed, opts.return_samples, worker, settings)
