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

Request (JSON; or with the binary tensor data extension, :mod:`bayesgate.service.oip_binary`,
the input's ``data`` replaced by ``"parameters": {"binary_data_size": B·784·4}`` and raw
little-endian float32 after the JSON header)::

    {"id": "optional, echoed", "parameters": {"mc_samples": 10, "seed": 7},
     "inputs": [{"name": "input", "datatype": "FP32", "shape": [B, 1, 28, 28],
                 "data": [... B·784 numbers, flat or nested as the shape ...]}],
     "outputs": [{"name": "probabilities"}, {"name": "adversarial"}]}   # optional selection

Request ``parameters``: ``mc_samples`` (K, 1 … max), ``seed`` (0 … 2⁶³−1; same input, seed and
K → same numbers, as in ``/v1/predict``), ``binary_data_output`` (every output without its own
``binary_data`` parameter is sent as raw bytes after the JSON header). Response ``parameters``:
``mc_samples``, ``calibration_mc_samples``, ``score_name``,
``threshold``, ``weights_sha256`` and ``seed`` when given. Unknown fields and parameters are
rejected (400) so that a misspelt ``mc_samples`` never silently falls back to the default.

The request's structure and types are :class:`InferRequest` (pydantic, strict: it validates the
body and documents it in the OpenAPI schema; :func:`infer_request_model` puts in this server's
bound on ``mc_samples``); what depends on the model's card (shape, range, batch size) and the
tensor data (one array operation, not per number) is checked by :func:`parse_infer_request`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from bayesgate.service.errors import (
    InvalidInput,
    ModelNotFound,
    describe_validation_errors,
    out_of_range,
)
from bayesgate.service.inputs import check_values, kind_text, may_hold_booleans, reject_booleans
from bayesgate.service.oip_binary import HEADER_NAME, check_consumed, split_body, tensor_from_bytes
from bayesgate.service.prediction import Prediction
from bayesgate.service.request_body import parse_json
from bayesgate.service.schemas import MAX_SEED
from bayesgate.service.served_model import ModelRef, ServedModel
from bayesgate.service.settings import Settings

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
# --- schemas ----------------------------------------------------------------------------------


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
    model_config = ConfigDict(extra="forbid", strict=True)

    mc_samples: int | None = Field(None, ge=1, description="MC dropout passes K")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="seed of the dropout masks")
    binary_data_output: bool | None = Field(
        None, description="outputs as raw bytes after the JSON header (binary tensor extension)"
    )
    timeout: int | None = Field(
        None,
        ge=1,
        description="Triton's per-request timeout in microseconds (tritonclient's "
        "infer(timeout=…)): the request's deadline is the sooner of it and the server's "
        "request timeout",
    )


class InputParameters(BaseModel):
    """``binary_data_size``: the tensor's bytes follow the JSON header (binary extension)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    binary_data_size: int | None = Field(
        None, ge=0, description="bytes of this tensor after the JSON header (B·784·4 for FP32)"
    )


class InferInputTensor(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Literal["input"] = Field(description="the model's one input")
    datatype: Literal["FP32"]
    shape: list[int] = Field(description="[B, 1, 28, 28] (the card's input shape after B)")
    data: list[Any] | None = Field(
        None,
        description="B·784 numbers in [0, 1], flat or nested as the shape "
        "(absent when parameters.binary_data_size is given)",
    )
    parameters: InputParameters | None = None

    @property
    def binary_data_size(self) -> int | None:
        return None if self.parameters is None else self.parameters.binary_data_size

    @model_validator(mode="after")
    def _data_or_binary(self) -> InferInputTensor:
        if self.data is None and self.binary_data_size is None:
            raise PydanticCustomError(
                "missing_data",
                "missing field 'data' (or parameters.binary_data_size with binary data)",
            )
        if self.data is not None and self.binary_data_size is not None:
            raise PydanticCustomError(
                "data_and_binary", "give either 'data' or parameters.binary_data_size, not both"
            )
        return self


class OutputParameters(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    binary_data: bool | None = Field(
        None, description="this output as raw bytes after the JSON header (binary extension)"
    )


class RequestedOutput(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(description="an output of the model metadata (GET /v2/models/{name})")
    parameters: OutputParameters | None = None


class InferRequest(BaseModel):
    """``POST /v2/models/{name}/infer``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str | None = Field(None, max_length=MAX_ID_LENGTH, description="echoed in the answer")
    parameters: InferParameters | None = None
    inputs: list[InferInputTensor] = Field(
        description=f"exactly one tensor, '{INPUT_NAME}'",
        json_schema_extra={"minItems": 1, "maxItems": 1},
    )
    outputs: list[RequestedOutput] | None = Field(
        None, min_length=1, description="which outputs, in which order (default: all)"
    )

    @field_validator("inputs", mode="before")
    @classmethod
    def _one_input(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) != 1:
            raise PydanticCustomError(
                "one_input",
                "expected a list with exactly one tensor named 'input', got {n} inputs",
                {"n": len(value)},
            )
        return value

    @field_validator("outputs")
    @classmethod
    def _distinct_outputs(cls, value: list[RequestedOutput] | None) -> Any:
        names = [output.name for output in value or ()]
        for name in names:
            if names.count(name) > 1:
                raise PydanticCustomError(
                    "duplicate_output", "output '{name}' requested twice", {"name": name}
                )
        return value


def infer_request_model(settings: Settings) -> type[InferRequest]:
    """:class:`InferRequest` with this server's bound on ``parameters.mc_samples``."""
    parameters = create_model(
        "InferParameters",
        __base__=InferParameters,
        __module__=__name__,
        mc_samples=(
            int | None,
            Field(None, ge=1, le=settings.max_mc_samples, description="MC dropout passes K"),
        ),
    )
    return create_model(
        "InferRequest",
        __base__=InferRequest,
        __module__=__name__,
        parameters=(parameters | None, None),
    )


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[float | int | bool]


class InferResponse(BaseModel):
    # ``model_name`` is the protocol's field; pydantic < 2.10 warns about its ``model_`` prefix
    model_config = ConfigDict(protected_namespaces=())

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


def check_version(name: str, version: str) -> None:
    """The served model has no versions (its metadata lists none, so clients address it without
    one): a request naming a version is :class:`ModelNotFound`, as Triton answers a version it
    does not hold — on HTTP (``/v2/models/{name}/versions/{version}/…``) and gRPC alike."""
    if version:
        raise ModelNotFound(
            f"model {name!r} has no version {version!r}: this server's model is unversioned (its "
            "metadata lists no versions); leave the version out"
        )


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


def model_config(serving: ServedModel, max_batch_size: int) -> dict[str, Any]:
    """Triton's model configuration (``GET /v2/models/{name}/config``): ``max_batch_size`` is the
    most instances one request may hold; ``dims`` exclude the batch axis, as in Triton."""
    meta = model_metadata(serving)

    def tensors(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"name": t["name"], "data_type": f"TYPE_{t['datatype']}", "dims": t["shape"][1:]}
            for t in items
        ]

    return {
        "name": serving.name,
        "platform": meta["platform"],
        "backend": "bayesgate",
        "max_batch_size": max_batch_size,
        "input": tensors(meta["inputs"]),
        "output": tensors(meta["outputs"]),
    }


# --- request ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedInfer:
    """A validated inference request: ``x`` is ``B×(input shape)`` float32."""

    x: torch.Tensor
    request_id: str | None
    mc_samples: int | None
    seed: int | None
    outputs: list[str]
    binary_outputs: frozenset[str] = frozenset()  # sent as raw bytes after the JSON header
    timeout_us: int | None = None  # the request's own timeout (Triton's parameter), µs

    def timeout_s(self, server_timeout_s: float) -> float:
        """The request's time budget: the server's request timeout, or the request's own
        ``timeout`` parameter when that is sooner."""
        if self.timeout_us is None:
            return server_timeout_s
        return min(server_timeout_s, self.timeout_us / 1e6)


def _input_dims(tensor: InferInputTensor, shape: tuple[int, ...], max_instances: int) -> list[int]:
    """The tensor's shape, checked to be ``[B, *shape]`` with ``1 ≤ B ≤ max_instances``."""
    where = "inputs[0]"
    expected = "[B, " + ", ".join(map(str, shape)) + "]"
    dims = tensor.shape
    if len(dims) != 1 + len(shape) or tuple(dims[1:]) != shape:
        raise InvalidInput(f"{where}.shape: expected {expected}, got {dims}")
    batch = dims[0]
    if batch < 1:
        raise InvalidInput(f"{where}.shape: the batch size must be at least 1, got {batch}")
    if batch > max_instances:
        raise InvalidInput(
            f"{where}.shape: {batch} instances in one request, at most {max_instances} allowed"
        )
    return dims


def _input_tensor(
    tensor: InferInputTensor,
    shape: tuple[int, ...],
    value_range: tuple[float, float],
    max_instances: int,
    blob: memoryview,
    source: bytes | None = None,
) -> torch.Tensor:
    """The tensor's data (JSON ``data`` or the binary part ``blob``) checked against the card's
    shape and range (one array operation; booleans in JSON ``data`` as in
    :func:`~bayesgate.service.inputs.decode_instances`, with the JSON text ``source``)."""
    where = "inputs[0]"
    dims = _input_dims(tensor, shape, max_instances)
    size = tensor.binary_data_size
    if size is None:
        booleans = source is None or may_hold_booleans(source)
        values = _json_data(tensor.data or [], dims, f"{where}.data", booleans)
    else:
        # a copy first: the bytes are read-only and, after a JSON header of any length, not
        # aligned for float32, which makes numpy's reductions several times slower
        values = np.array(tensor_from_bytes(blob, 0, size, INPUT_DATATYPE, dims, where))
    check_consumed(blob, 0 if size is None else size)
    check_values(f"{where}.data", values, value_range)  # on the values as sent (JSON: float64)
    return torch.from_numpy(values.astype(np.float32, copy=False))


def _json_data(data: list[Any], dims: list[int], where: str, booleans: bool = True) -> np.ndarray:
    """The JSON ``data`` list (flat, or nested as ``dims``) as one array of ``dims``; with
    ``booleans``, a boolean among the numbers is refused (numpy would read it as 0 or 1)."""
    batch = dims[0]
    size = math.prod(dims)
    if len(data) not in (size, batch):
        raise InvalidInput(
            f"{where}: expected {size} numbers (flat) or nested as {dims}, "
            f"got a list of {len(data)}"
        )
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError, RecursionError):
        raise InvalidInput(
            f"{where}: ragged or too deeply nested lists; expected the shape {dims}"
        ) from None
    if arr.dtype.kind not in "iuf":
        raise InvalidInput(f"{where}: expected numbers, got {kind_text(arr)}")
    if arr.shape not in ((size,), tuple(dims)):
        got = "×".join(map(str, arr.shape))
        raise InvalidInput(f"{where}: expected {size} numbers or the shape {dims}, got {got}")
    if booleans:
        reject_booleans(where, data)
    return arr.reshape(dims).astype(np.float64, copy=False)


def parse_infer_request(
    request: InferRequest,
    served: ServedModel,
    max_instances: int,
    blob: memoryview | None = None,
    source: bytes | None = None,
) -> ParsedInfer:
    """The validated body's tensor against the served model's card (``blob``: the bytes after
    the JSON header, binary tensor extension; ``source``: the JSON header's text, when known,
    which spares a body of numbers the per-number boolean check); every rejection is an
    :class:`InvalidInput` naming the field (→ 400 ``{"error": …}``)."""
    parameters = request.parameters or InferParameters()
    x = _input_tensor(
        request.inputs[0],
        served.input_shape,
        served.input_range,
        max_instances,
        memoryview(b"") if blob is None else blob,
        source,
    )
    outputs = _outputs(request, served)
    return ParsedInfer(
        x,
        request.id,
        parameters.mc_samples,
        parameters.seed,
        outputs,
        _binary_outputs(request, outputs, bool(parameters.binary_data_output)),
        parameters.timeout,
    )


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], payload: Any) -> M:
    """``payload`` (parsed JSON) as ``model``; :class:`InvalidInput` naming the fields otherwise
    (the messages FastAPI's validation of the body gave; an integer beyond 64 bits is said to be
    out of range, :func:`out_of_range`)."""
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        errors = [out_of_range(model, {**e, "loc": ("body", *e["loc"])}) for e in exc.errors()]
        raise InvalidInput(describe_validation_errors(errors)) from None


BINARY_HINT = (
    f"; a body with binary tensor data needs the {HEADER_NAME} header (the JSON header's "
    "length in bytes)"
)


def decode_infer(
    body: bytes,
    header_length: str | Sequence[str] | None,
    model: type[InferRequest],
    served: ServedModel,
    max_instances: int,
) -> ParsedInfer:
    """A whole ``/v2`` infer body → :class:`ParsedInfer`: split off the binary part
    (``Inference-Header-Content-Length``: the header's value, or every value it was sent with),
    parse the JSON header (orjson), validate it as ``model`` and check the tensor against the
    card. Pure CPU work on bytes, so it can run in a thread."""
    header, blob = split_body(body, header_length)
    if not header:
        raise InvalidInput("body: missing (expected a JSON object)")
    try:
        payload = parse_json(header)
    except InvalidInput as exc:
        if blob or not exc.message.startswith("body: not valid JSON"):
            raise
        raise InvalidInput(exc.message + BINARY_HINT) from None
    return parse_infer_request(
        validated(model, payload), served, max_instances, blob, source=header
    )


def _binary_outputs(request: InferRequest, names: list[str], default: bool) -> frozenset[str]:
    """The outputs sent as raw bytes: those whose ``binary_data`` is true, and — those that do
    not say — all when ``binary_data_output`` is."""
    own = {
        output.name: output.parameters.binary_data
        for output in request.outputs or ()
        if output.parameters is not None and output.parameters.binary_data is not None
    }
    return frozenset(name for name in names if own.get(name, default))


def _outputs(request: InferRequest, served: ServedModel) -> list[str]:
    """The requested output names (all by default), each one this model has."""
    table = output_table(served)
    if request.outputs is None:
        return list(table)
    names = [output.name for output in request.outputs]
    for i, name in enumerate(names):
        if name not in table:
            raise InvalidInput(
                f"outputs[{i}].name: unknown output {name!r}; this model has {', '.join(table)}"
            )
    return names


# --- response ---------------------------------------------------------------------------------


def infer_response(predictions: list[Prediction], request: ParsedInfer, k: int) -> dict[str, Any]:
    """The response body: the model, score and threshold are those of the model that computed
    the predictions (an admin change may land between the request's start and its batch)."""
    first = predictions[0]
    body = response_head(first.model, first.score_name, first.threshold, k, request.seed,
                         request.request_id)  # fmt: skip
    body["outputs"] = encode_outputs(predictions, request.outputs)
    return body


def response_head(
    model: ModelRef,
    score_name: str,
    threshold: float,
    k: int,
    seed: int | None,
    request_id: str | None = None,
) -> dict[str, Any]:
    """The response body's fields before ``outputs``, in their order (the native front end
    writes the same head before its binary outputs)."""
    parameters: dict[str, Any] = {
        "mc_samples": k,
        "calibration_mc_samples": model.calibration_mc_samples,
        "score_name": score_name,
        "threshold": threshold,
        "weights_sha256": model.weights_sha256,
    }
    if seed is not None:
        parameters["seed"] = seed
    body: dict[str, Any] = {"model_name": model.name}
    if request_id is not None:
        body["id"] = request_id
    body["parameters"] = parameters
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
