"""Request and response bodies of the ``/v1`` API (pydantic), and the ``/v1`` encoding of the
worker's :class:`~bayesgate.service.prediction.Prediction` s."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from bayesgate.service.prediction import Prediction

MAX_SEED = 2**63 - 1


class PredictRequest(BaseModel):
    """``POST /v1/predict``: exactly one of ``instances`` or ``images``."""

    model_config = ConfigDict(extra="forbid")

    instances: list[Any] | None = Field(
        None,
        description="images as nested lists (1×28×28 or 28×28) or flat 784 lists, values in [0,1]",
    )
    images: list[Any] | None = Field(
        None, description="base64-encoded PNG files, 8-bit grayscale 28×28 (scaled by /255)"
    )
    mc_samples: int | None = Field(
        None, description="MC dropout passes K (1 … max_mc_samples; default: the server's)"
    )
    return_samples: bool = Field(False, description="also return the K×C sampled probabilities")
    seed: int | None = Field(
        None, ge=0, le=MAX_SEED, description="seed of the dropout masks: same input+seed+K → same"
    )


class ModelRef(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    weights_sha256: str


class InstancePrediction(BaseModel):
    """The ``/v1`` encoding of one :class:`~bayesgate.service.prediction.Prediction`."""

    model_config = ConfigDict(from_attributes=True)

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
        "predicted class) and fused (the logistic-regression logit)"
    )
    samples: list[list[float]] | None = Field(None, description="K×C probabilities if asked")


class PredictResponse(BaseModel):
    model: ModelRef = Field(description="the weights that computed these predictions")
    mc_samples: int
    calibration_mc_samples: int = Field(description="K the threshold was calibrated with")
    seed: int | None = None
    predictions: list[InstancePrediction]


def predict_response(predictions: list[Prediction], k: int, seed: int | None) -> PredictResponse:
    """The ``/v1`` answer: one engine call computed a request's predictions, so they all name the
    same model, the one reported at the top."""
    model = predictions[0].model
    return PredictResponse.model_validate(
        {
            "model": model,
            "mc_samples": k,
            "calibration_mc_samples": model.calibration_mc_samples,
            "seed": seed,
            "predictions": predictions,
        },
        from_attributes=True,
    )


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
    404: "unknown model",
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
