"""Request and response bodies of the ``/v1`` API (pydantic), and the ``/v1`` encoding of the
worker's :class:`~bayesgate.service.prediction.Prediction` s.

Each request model both validates its route's body (strictly: ``true`` is not an integer, ``"5"``
is not a number, ``"yes"`` is not a boolean) and documents it in the OpenAPI schema. Limits that
come from the settings (``mc_samples`` ≤ ``BAYESGATE_MAX_MC_SAMPLES``, at most
``BAYESGATE_MAX_INSTANCES`` images) are put in by :func:`predict_request_model` and
:func:`file_form_model`, once per app. Array contents (784 numbers per image) are not validated
value by value here: :mod:`bayesgate.service.inputs` checks them in one array operation.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from fastapi import UploadFile
from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator
from pydantic_core import PydanticCustomError

from bayesgate.models.mc.options import MAX_SEED
from bayesgate.service.prediction import Prediction
from bayesgate.service.settings import Settings

MC_SAMPLES = (
    "MC dropout passes K (default: BAYESGATE_DEFAULT_MC_SAMPLES, else the flag's K: the "
    "detector's when it decides, else calibration.json's)"
)
SEED = "seed of the dropout masks: the same input, seed and K give the same numbers"


def schema_only(**keywords: Any) -> Callable[[dict[str, Any]], None]:
    """``json_schema_extra`` that documents ``keywords`` (checked by the decoders, which answer
    with their own status, e.g. 413 for too many images) and drops the ``default`` of a field
    that may be absent but not ``null``."""

    def apply(schema: dict[str, Any]) -> None:
        schema.pop("default", None)
        schema.update(keywords)

    return apply


# What the decoder accepts of an image string (a PNG's contents cannot be said in JSON Schema).
BASE64_PNG = {
    "type": "string",
    "minLength": 4,
    "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
    "contentEncoding": "base64",
    "contentMediaType": "image/png",
}


class PredictRequest(BaseModel):
    """``POST /v1/predict``: exactly one of ``instances`` or ``images``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"oneOf": [{"required": ["instances"]}, {"required": ["images"]}]},
    )

    instances: list[Any] = Field(
        None,  # absent; an explicit null is rejected
        description="images as nested lists (1×28×28 or 28×28) or flat 784 lists, values in [0,1]",
        json_schema_extra=schema_only(minItems=1, items={"type": "array"}),
    )
    images: list[str] = Field(
        None,
        description="base64-encoded PNG files, grayscale (bit depth 1–8) 28×28, scaled to [0, 1]",
        json_schema_extra=schema_only(minItems=1, items=BASE64_PNG),
    )
    mc_samples: int | None = Field(None, ge=1, description=MC_SAMPLES)
    return_samples: bool = Field(False, description="also return the K×C sampled probabilities")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description=SEED)

    @model_validator(mode="after")
    def _exactly_one_input(self) -> PredictRequest:
        if ("instances" in self.model_fields_set) == ("images" in self.model_fields_set):
            raise PydanticCustomError(
                "one_input", "give exactly one of 'instances' (arrays) or 'images' (base64 PNG)"
            )
        return self


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def exact_integer_bounds(node: Any) -> None:
    """Give integer schemas their bounds back as integers, in place.

    FastAPI passes the OpenAPI document through its own models, whose bounds are floats: every
    ``maximum: 100`` becomes ``100.0``, and ``MAX_SEED`` = 2⁶³ − 1 becomes 2⁶³ — a seed the server
    refuses. Below 2⁵³ a float holds the integer exactly; above, the known bound is put back."""
    if isinstance(node, list):
        for item in node:
            exact_integer_bounds(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        for key in BOUNDS:
            value = node.get(key)
            if isinstance(value, float) and value.is_integer():
                node[key] = MAX_SEED if value == float(MAX_SEED) else int(value)
    for value in node.values():
        exact_integer_bounds(value)


def form_fields_not_null(schema: dict[str, Any]) -> None:
    """A form field is text and cannot be ``null``: an optional field is documented by its type
    alone (omit it for the default), not as ``anyOf: [type, null]``."""
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf")
        if options is None:
            continue
        kept = [o for o in options if o.get("type") != "null"]
        if len(kept) == 1:
            del prop["anyOf"]
            prop.update(kept[0])
        if "default" in prop and prop["default"] is None:
            del prop["default"]


class FileForm(BaseModel):
    """``POST /v1/predict/file``: one PNG in ``file``, options as form fields (form fields are
    text: ``mc_samples=5`` is the number 5, ``return_samples=true`` the boolean)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=form_fields_not_null)

    file: UploadFile = Field(description="one PNG file, grayscale (bit depth 1–8) 28×28")
    mc_samples: int | None = Field(None, ge=1, description=MC_SAMPLES)
    return_samples: bool = Field(False, description="also return the K×C sampled probabilities")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description=SEED)


def _bounded_k(settings: Settings) -> tuple[Any, Any]:
    return (
        int | None,
        Field(None, ge=1, le=settings.max_mc_samples, description=MC_SAMPLES),
    )


def predict_request_model(settings: Settings) -> type[PredictRequest]:
    """:class:`PredictRequest` with this server's limits in its schema (and ``mc_samples``
    validated against them)."""
    instances = (
        list[Any],
        Field(
            None,
            description=PredictRequest.model_fields["instances"].description,
            json_schema_extra=schema_only(
                minItems=1, maxItems=settings.max_instances, items={"type": "array"}
            ),
        ),
    )
    images = (
        list[str],
        Field(
            None,
            description=PredictRequest.model_fields["images"].description,
            json_schema_extra=schema_only(
                minItems=1, maxItems=settings.max_instances, items=BASE64_PNG
            ),
        ),
    )
    return create_model(
        "PredictRequest",
        __base__=PredictRequest,
        __module__=__name__,
        instances=instances,
        images=images,
        mc_samples=_bounded_k(settings),
    )


def file_form_model(settings: Settings) -> type[FileForm]:
    """:class:`FileForm` with this server's bound on ``mc_samples``."""
    return create_model(
        "FileForm", __base__=FileForm, __module__=__name__, mc_samples=_bounded_k(settings)
    )


class ModelRef(BaseModel):
    name: str
    weights_sha256: str


class InstancePrediction(BaseModel):
    """The ``/v1`` encoding of one :class:`~bayesgate.service.prediction.Prediction` (its fields
    of the same names)."""

    label: int = Field(description="class index argmax_c p̄_c")
    class_name: str
    probabilities: list[float] = Field(description="MC predictive mean p̄ = (1/K) Σ_k p_k")
    predictive_entropy: float = Field(description="H[p̄] = −Σ_c p̄_c log p̄_c (nats)")
    mutual_information: float = Field(description="H[p̄] − (1/K) Σ_k H[p_k] (nats)")
    variation_ratio: float = Field(description="1 − f_mode/K")
    aleatoric_variance: float = Field(
        description="Kwon et al.: Σ_c (p̄_c − (1/K) Σ_k p_kc²), the expected per-pass variance"
    )
    epistemic_variance: float = Field(
        description="Kwon et al.: Σ_c (1/K) Σ_k (p_kc − p̄_c)², the spread between passes"
    )
    score_name: str = Field(
        description="the score used for the flag: 'fused' when the model has a fused detector"
    )
    score: float
    threshold: float
    adversarial: bool = Field(description="score > threshold")
    scores: dict[str, float] = Field(
        description="every score by name, higher = more suspicious: predictive_entropy, "
        "mutual_information, variation_ratio and, with a fused detector, mahalanobis_<layer> "
        "(closest class), mahalanobis_<layer>_predicted, neg_log_kde (−log kernel density of the "
        "predicted class), fused_logistic (the logistic-regression logit) and fused (−log of the "
        "minimum conformal p-value of fused_logistic and predictive_entropy; the logit itself for "
        "a detector fitted with --rule logistic)"
    )
    samples: list[list[float]] | None = Field(None, description="K×C probabilities if asked")


class PredictResponse(BaseModel):
    model: ModelRef = Field(description="the weights that computed these predictions")
    mc_samples: int
    calibration_mc_samples: int = Field(description="K the threshold was calibrated with")
    seed: int | None = None
    predictions: list[InstancePrediction]


INSTANCE_FIELDS = tuple(InstancePrediction.model_fields)
_instance_values = attrgetter(*INSTANCE_FIELDS)


def predict_response(predictions: list[Prediction], k: int, seed: int | None) -> dict[str, Any]:
    """The ``/v1`` answer (validated and serialised once, by the route's ``response_model``): one
    engine call computed a request's predictions, so they all name the same model, the one
    reported at the top."""
    model = predictions[0].model
    return {
        "model": {"name": model.name, "weights_sha256": model.weights_sha256},
        "mc_samples": k,
        "calibration_mc_samples": model.calibration_mc_samples,
        "seed": seed,
        "predictions": [instance_dict(p) for p in predictions],
    }


def instance_dict(prediction: Prediction) -> dict[str, Any]:
    """The ``/v1`` encoding of one prediction (:class:`InstancePrediction`'s fields, in order)."""
    return dict(zip(INSTANCE_FIELDS, _instance_values(prediction), strict=True))


class ModelList(BaseModel):
    models: list[dict[str, Any]]


class ErrorBody(BaseModel):
    """Every error of the native routes."""

    error: str = Field(description="what went wrong, naming the field")
    detail: str = Field(description="the same message (FastAPI's key)")
    code: str = Field(description="stable identifier, e.g. invalid_input, queue_full")


class V2ErrorBody(BaseModel):
    """Every error of the Open Inference Protocol routes (``/v2``)."""

    error: str


_DESCRIPTIONS = {
    400: "bad request (the message names the field)",
    401: "missing or invalid API key",
    403: "admin routes disabled (no API key configured)",
    404: "unknown model, or a demo route on a server started without --demo",
    409: "the store's model cannot replace the served one",
    413: "body or instance count too large",
    415: "wrong Content-Type",
    422: "invalid input (the message names the field)",
    500: "inference failed",
    503: "not ready, draining, or queue full (Retry-After)",
    504: "request timeout",
}


def error_responses(*codes: int, v2: bool = False) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the given error statuses, with the error body schema."""
    model = V2ErrorBody if v2 else ErrorBody
    return {code: {"model": model, "description": _DESCRIPTIONS[code]} for code in codes}


ERROR_RESPONSES = error_responses(*_DESCRIPTIONS)
