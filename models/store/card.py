"""The model card (``card.json``): a typed record of what a model is and how to run it.

Every default lives here, once: readers use ``card.inference.k_test``, ``card.training.val_size``,
``card.input.shape`` and never re-default a dict key. A card written by any earlier version of
this format (``bayesgate-model/1``) reads unchanged; keys the format no longer has are ignored.

Sections:

- ``architecture`` — the dict :func:`~bayesgate.models.networks.registry.build_network` rebuilds
  the network from (its keys are the network's constructor arguments, so they stay a dict);
- ``input`` (:class:`InputSpec`) — shape of one image, dtype, value range; the service validates
  requests against it;
- ``training`` (:class:`TrainingRecord`) — how the model was trained: the fields readers need are
  typed, and the run's hyper-parameters and statistics are kept beside them as they were written;
- ``inference`` (:class:`InferenceSettings`) — MC samples for predictions and for attacks;
- ``metrics`` — evaluation results per split, as ``bayesgate train`` / ``evaluate`` wrote them.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    field_validator,
)

from bayesgate.errors import ModelStoreError
from bayesgate.models.data.mnist import DEFAULT_VAL_SIZE, IMAGE_SIZE, NUM_CLASSES

CARD_FORMAT = "bayesgate-model/1"
REQUIRED_FIELDS = ("name", "architecture", "weights_sha256")


class _Section(BaseModel):
    # Unknown keys of old cards are dropped; assignments are validated like parsed cards.
    model_config = ConfigDict(extra="ignore", validate_assignment=True)


class InputSpec(_Section):
    """One input image: ``shape`` (e.g. ``[1, 28, 28]``), ``dtype``, value ``range`` [lo, hi]."""

    shape: list[PositiveInt] = Field(
        default_factory=lambda: [1, IMAGE_SIZE, IMAGE_SIZE], min_length=1
    )
    dtype: str = "float32"
    range: tuple[float, float] = (0.0, 1.0)

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not value[0] < value[1]:
            raise ValueError(f"range must be [lo, hi] with lo < hi, got {list(value)}")
        return value


class InferenceSettings(_Section):
    """MC samples: ``k_test`` for predictions and uncertainty scores (the service's default K
    and what calibration uses), ``k_attack`` inside the attacked log-predictive (as the paper)."""

    k_test: PositiveInt = 100
    k_attack: PositiveInt = 10


class TrainingRecord(_Section):
    """How the model was trained. ``alpha`` (BB-α α; None when unknown), ``k_train`` (MC samples
    per training example) and ``val_size`` (images held out of the 60k MNIST training images:
    the validation split calibration uses) are typed; the rest of the run's record
    (``TrainConfig`` fields, data fingerprint, timing) is kept as written, readable as attributes
    or through :attr:`model_extra`."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    alpha: float | None = Field(default=None, ge=0.0)
    k_train: PositiveInt | None = None
    val_size: NonNegativeInt = DEFAULT_VAL_SIZE


class ModelCard(BaseModel):
    """Metadata stored next to the weights (``card.json``)."""

    model_config = ConfigDict(extra="ignore", validate_assignment=True)

    name: str
    architecture: dict[str, Any]
    input: InputSpec = Field(default_factory=InputSpec)
    classes: list[str] = Field(default_factory=lambda: [str(i) for i in range(NUM_CLASSES)])
    training: TrainingRecord = Field(default_factory=TrainingRecord)
    inference: InferenceSettings = Field(default_factory=InferenceSettings)
    metrics: dict[str, Any] = Field(default_factory=dict)
    weights_sha256: str = ""
    code_version: str = ""
    created: str = ""
    format: str = CARD_FORMAT

    @property
    def stochastic(self) -> bool:
        """False for a deterministic baseline (dropout off at test time)."""
        return bool(self.architecture.get("stochastic", True))

    def to_dict(self) -> dict[str, Any]:
        """The card as plain JSON types, in ``card.json``'s key order."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "card") -> ModelCard:
        """Parse a card; :class:`ModelStoreError` naming ``source`` and the bad field otherwise."""
        if data.get("format") != CARD_FORMAT:
            raise ModelStoreError(
                f"{source}: unsupported card format {data.get('format')!r}, "
                f"expected {CARD_FORMAT!r}"
            )
        missing = set(REQUIRED_FIELDS) - set(data)
        if missing:
            raise ModelStoreError(
                f"{source}: card lacks required field(s) {', '.join(sorted(missing))}"
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ModelStoreError(f"{source}: {_first_problem(exc)}") from exc


def _first_problem(exc: ValidationError) -> str:
    """``input.shape.0: Input should be greater than 0 (+1 more)`` from a validation error."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "card"
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"
