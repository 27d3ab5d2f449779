"""Open Inference Protocol (KServe v2 / Triton HTTP) tensors: request decoding, response encoding.

The served model has one input and at least nine outputs (``B`` = batch, ``C`` = classes; per
instance ``b`` with MC samples ``p_k``, the fields of
:class:`bayesgate.service.prediction.Prediction`):

- ``input`` FP32 ``[-1, *card input shape]`` (``[-1, 1, 28, 28]``), values in the card's range;
- ``probabilities`` FP32 ``[-1, C]``: ``p̄ = (1/K) Σ_k p_k``;
- ``label`` INT64 ``[-1]``: ``argmax_c p̄_c``;
- ``predictive_entropy`` FP32 ``[-1]``: ``H[p̄] = −Σ_c p̄_c log p̄_c``;
- ``mutual_information`` FP32 ``[-1]``: ``H[p̄] − (1/K) Σ_k H[p_k]``;
- ``variation_ratio`` FP32 ``[-1]``: ``1 − f_mode/K``;
- ``aleatoric_variance`` FP32 ``[-1]``: Kwon et al.'s aleatoric part,
  ``tr(diag(p̄) − (1/K) Σ_k p_k p_kᵀ) = 1 − (1/K) Σ_k ‖p_k‖²``;
- ``epistemic_variance`` FP32 ``[-1]``: Kwon et al.'s epistemic part,
  ``tr((1/K) Σ_k (p_k − p̄)(p_k − p̄)ᵀ) = (1/K) Σ_k ‖p_k‖² − ‖p̄‖²`` (the two sum to ``1 − ‖p̄‖²``);
- ``adversarial`` BOOL ``[-1]``: ``score > threshold``;
- ``score`` FP32 ``[-1]``: the value of the score that sets the flag (``score_name`` among the
  response parameters; ``fused`` when the model has a fused detector);
- every other score of the model, FP32 ``[-1]`` each, named as in ``/v1``'s ``scores``: with a
  fused detector ``mahalanobis_<layer>``, ``mahalanobis_<layer>_predicted``, ``neg_log_kde`` and
  ``fused`` (the model metadata lists them).

Request (JSON only; the binary tensor extension is not supported)::

    {"id": "optional, echoed", "parameters": {"mc_samples": 10, "seed": 7},
     "inputs": [{"name": "input", "datatype": "FP32", "shape": [B, 1, 28, 28],
                 "data": [... B·784 numbers, flat or nested as the shape ...]}],
     "outputs": [{"name": "probabilities"}, {"name": "adversarial"}]}   # optional selection

Request ``parameters``: ``mc_samples`` (K, 1 … max), ``seed`` (0 … 2⁶³−1; same input, seed and
K → same numbers, as in ``/v1/predict``), ``binary_data_output`` (accepted; the answer is JSON
anyway). Response ``parameters``: ``mc_samples``, ``calibration_mc_samples``, ``score_name``,
``threshold``, ``weights_sha256`` and ``seed`` when given. Unknown fields and parameters are
rejected (400) so that a misspelt ``mc_samples`` never silently falls back to the default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from bayesgate.service.errors import InvalidInput
from bayesgate.service.inputs import check_values
from bayesgate.service.prediction import Prediction
from bayesgate.service.schemas import MAX_SEED
from bayesgate.service.served_model import ServedModel

INPUT_NAME = "input"
INPUT_DATATYPE = "FP32"
MAX_ID_LENGTH = 256

# name → (datatype, per-instance shape after the batch axis; "C" = number of classes)
OUTPUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "probabilities": ("FP32", ("C",)),
    "label": ("INT64", ()),
    "predictive_entropy": ("FP32", ()),
    "mutual_information": ("FP32", ()),
    "variation_ratio": ("FP32", ()),
    "aleatoric_variance": ("FP32", ()),
    "epistemic_variance": ("FP32", ()),
    "adversarial": ("BOOL", ()),
}
REQUEST_FIELDS = frozenset({"id", "parameters", "inputs", "outputs"})
REQUEST_PARAMETERS = frozenset({"mc_samples", "seed", "binary_data_output"})
INPUT_FIELDS = frozenset({"name", "shape", "datatype", "data", "parameters"})
OUTPUT_FIELDS = frozenset({"name", "parameters"})
OUTPUT_PARAMETERS = frozenset({"binary_data"})


# --- schemas (OpenAPI documentation; the route validates with :func:`parse_infer_request`) -----


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool


class ModelReadyResponse(BaseModel):
    name: str
    ready: bool


class InferParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mc_samples: int | None = Field(None, ge=1, description="MC dropout passes K")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="seed of the dropout masks")
    binary_data_output: bool | None = Field(None, description="accepted; answers are JSON")


class InferInputTensor(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description=f"'{INPUT_NAME}'")
    datatype: str = Field(description=f"'{INPUT_DATATYPE}'")
    shape: list[int] = Field(description="[B, 1, 28, 28]")
    data: list[Any] = Field(description="B·784 numbers in [0, 1], flat or nested as the shape")


class RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    parameters: dict[str, bool] | None = None


class InferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    parameters: InferParameters | None = None
    inputs: list[InferInputTensor]
    outputs: list[RequestedOutput] | None = None


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[float | int | bool]


class InferResponse(BaseModel):
    model_name: str
    id: str | None = None
    parameters: dict[str, str | int | float | bool]
    outputs: list[OutputTensor]


# --- metadata ---------------------------------------------------------------------------------


def output_table(serving: ServedModel) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The outputs of this model: :data:`OUTPUTS`, ``score``, and each of its scores not in
    :data:`OUTPUTS` (the detector's), FP32 per instance."""
    extra = {name: ("FP32", ()) for name in serving.score_names if name not in OUTPUTS}
    return {**OUTPUTS, "score": ("FP32", ()), **extra}


def model_metadata(serving: ServedModel) -> dict[str, Any]:
    classes = len(serving.card.classes)
    outputs = [
        {
            "name": name,
            "datatype": datatype,
            "shape": [-1, *(classes if d == "C" else int(d) for d in dims)],
        }
        for name, (datatype, dims) in output_table(serving).items()
    ]
    return {
        "name": serving.name,
        "versions": [],
        "platform": "bayesgate-mc-dropout",
        "inputs": [
            {"name": INPUT_NAME, "datatype": INPUT_DATATYPE, "shape": [-1, *serving.input_shape]}
        ],
        "outputs": outputs,
    }


# --- request ----------------------------------------------------------------------------------


class ParsedInfer:
    """A validated inference request: ``x`` is ``B×(input shape)`` float32."""

    def __init__(
        self,
        x: torch.Tensor,
        request_id: str | None,
        mc_samples: int | None,
        seed: int | None,
        outputs: list[str],
    ) -> None:
        self.x = x
        self.request_id = request_id
        self.mc_samples = mc_samples
        self.seed = seed
        self.outputs = outputs


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unknown(where: str, keys: Sequence[str], allowed: frozenset[str]) -> None:
    extra = sorted(set(keys) - allowed)
    if extra:
        raise InvalidInput(
            f"{where}: unknown field(s) {', '.join(map(repr, extra))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _parameters(raw: Any) -> tuple[int | None, int | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise InvalidInput("parameters: expected an object")
    _unknown("parameters", list(raw), REQUEST_PARAMETERS)
    k, seed = raw.get("mc_samples"), raw.get("seed")
    if k is not None and not _is_int(k):
        raise InvalidInput(f"parameters.mc_samples: expected an integer, got {k!r}")
    if seed is not None and not (_is_int(seed) and 0 <= seed <= MAX_SEED):
        raise InvalidInput(f"parameters.seed: expected an integer in 0 … 2^63−1, got {seed!r}")
    binary = raw.get("binary_data_output")
    if binary is not None and not isinstance(binary, bool):
        raise InvalidInput(f"parameters.binary_data_output: expected a boolean, got {binary!r}")
    return k, seed


def _outputs(raw: Any, table: dict[str, tuple[str, tuple[str, ...]]]) -> list[str]:
    if raw is None:
        return list(table)
    if not isinstance(raw, list) or not raw:
        raise InvalidInput('outputs: expected a non-empty list of {"name": ...} objects')
    names: list[str] = []
    for i, item in enumerate(raw):
        where = f"outputs[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput(f"{where}: expected an object with a 'name'")
        _unknown(where, list(item), OUTPUT_FIELDS)
        name = item.get("name")
        if name not in table:
            raise InvalidInput(
                f"{where}.name: unknown output {name!r}; this model has {', '.join(table)}"
            )
        if name in names:
            raise InvalidInput(f"{where}.name: output {name!r} requested twice")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput(f"{where}.parameters: expected an object")
        _unknown(f"{where}.parameters", list(params), OUTPUT_PARAMETERS)
        if not isinstance(params.get("binary_data", False), bool):
            raise InvalidInput(f"{where}.parameters.binary_data: expected a boolean")
        names.append(name)
    return names


def _input_tensor(
    raw: Any, shape: tuple[int, ...], value_range: tuple[float, float], max_instances: int
) -> torch.Tensor:
    where = "inputs[0]"
    if not isinstance(raw, dict):
        raise InvalidInput(f"{where}: expected an object with name, datatype, shape and data")
    _unknown(where, list(raw), INPUT_FIELDS)
    for key in ("name", "datatype", "shape", "data"):
        if key not in raw:
            raise InvalidInput(f"{where}: missing field '{key}'")
    if raw["name"] != INPUT_NAME:
        raise InvalidInput(
            f"{where}.name: unknown input {raw['name']!r}; this model has one input '{INPUT_NAME}'"
        )
    if raw["datatype"] != INPUT_DATATYPE:
        raise InvalidInput(
            f"{where}.datatype: expected '{INPUT_DATATYPE}', got {raw['datatype']!r}"
        )
    if raw.get("parameters"):
        raise InvalidInput(
            f"{where}.parameters: not supported (binary tensor data is not; send JSON 'data')"
        )
    expected = "[B, " + ", ".join(map(str, shape)) + "]"
    dims = raw["shape"]
    if not (isinstance(dims, list) and all(_is_int(d) for d in dims)):
        raise InvalidInput(f"{where}.shape: expected a list of integers {expected}")
    if len(dims) != 1 + len(shape) or tuple(dims[1:]) != shape:
        raise InvalidInput(f"{where}.shape: expected {expected}, got {dims}")
    batch = dims[0]
    if batch < 1:
        raise InvalidInput(f"{where}.shape: the batch size must be at least 1, got {batch}")
    if batch > max_instances:
        raise InvalidInput(
            f"{where}.shape: {batch} instances in one request, at most {max_instances} allowed"
        )
    data = raw["data"]
    size = batch * math.prod(shape)
    if not isinstance(data, list):
        raise InvalidInput(f"{where}.data: expected a list of numbers")
    if len(data) not in (size, batch):
        raise InvalidInput(
            f"{where}.data: expected {size} numbers (flat) or nested as {dims}, "
            f"got a list of {len(data)}"
        )
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, RecursionError):
        raise InvalidInput(
            f"{where}.data: ragged or too deeply nested lists; expected the shape {dims}"
        ) from None
    if arr.dtype.kind not in "iuf":
        raise InvalidInput(f"{where}.data: expected numbers, got {_kind(arr)}")
    if arr.shape not in ((size,), tuple(dims)):
        got = "×".join(map(str, arr.shape))
        raise InvalidInput(f"{where}.data: expected {size} numbers or the shape {dims}, got {got}")
    values = arr.reshape(batch, *shape).astype(np.float64, copy=False)
    check_values(f"{where}.data", values, value_range)
    return torch.from_numpy(values.astype(np.float32))


def _kind(arr: np.ndarray) -> str:
    return {"b": "booleans", "U": "strings", "S": "bytes", "O": "non-numeric values"}.get(
        arr.dtype.kind, str(arr.dtype)
    )


def parse_infer_request(payload: Any, serving: ServedModel, max_instances: int) -> ParsedInfer:
    """Validate a decoded JSON body; every rejection is an :class:`InvalidInput` naming the
    field (→ 400 ``{"error": …}``)."""
    if not isinstance(payload, dict):
        raise InvalidInput("body: expected a JSON object with 'inputs'")
    _unknown("body", list(payload), REQUEST_FIELDS)
    request_id = payload.get("id")
    if request_id is not None and not (
        isinstance(request_id, str) and len(request_id) <= MAX_ID_LENGTH
    ):
        raise InvalidInput(f"id: expected a string of at most {MAX_ID_LENGTH} characters")
    k, seed = _parameters(payload.get("parameters"))
    outputs = _outputs(payload.get("outputs"), output_table(serving))
    inputs = payload.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1:
        got = f"{len(inputs)} inputs" if isinstance(inputs, list) else "no list"
        raise InvalidInput(
            f"inputs: expected a list with exactly one tensor named '{INPUT_NAME}', got {got}"
        )
    x = _input_tensor(inputs[0], serving.input_shape, serving.input_range, max_instances)
    return ParsedInfer(x, request_id, k, seed, outputs)


# --- response ---------------------------------------------------------------------------------


def infer_response(predictions: list[Prediction], request: ParsedInfer, k: int) -> dict[str, Any]:
    """The response body: the model, score and threshold are those of the model that computed
    the predictions (an admin change may land between the request's start and its batch)."""
    model = predictions[0].model
    parameters: dict[str, Any] = {
        "mc_samples": k,
        "calibration_mc_samples": model.calibration_mc_samples,
        "score_name": predictions[0].score_name,
        "threshold": predictions[0].threshold,
        "weights_sha256": model.weights_sha256,
    }
    if request.seed is not None:
        parameters["seed"] = request.seed
    body: dict[str, Any] = {"model_name": model.name}
    if request.request_id is not None:
        body["id"] = request.request_id
    body["parameters"] = parameters
    body["outputs"] = encode_outputs(predictions, request.outputs)
    return body


def encode_outputs(predictions: list[Prediction], names: list[str]) -> list[dict[str, Any]]:
    """Predictions → the requested output tensors (batch first, flat data)."""
    batch = len(predictions)
    out = []
    for name in names:
        datatype = OUTPUTS[name][0] if name in OUTPUTS else "FP32"
        if name == "probabilities":
            data: list[Any] = [p for row in predictions for p in row.probabilities]
            shape = [batch, len(predictions[0].probabilities)]
        elif name in OUTPUTS or name == "score":
            data = [getattr(row, name) for row in predictions]
            shape = [batch]
        else:  # one of the model's scores
            data = [row.scores[name] for row in predictions]
            shape = [batch]
        out.append({"name": name, "datatype": datatype, "shape": shape, "data": data})
    return out
