"""The model store: a directory with ``model.safetensors``, ``card.json`` and ``calibration.json``,
sha256-verified, rebuilt from the card (no pickle). The card is typed (:mod:`.card`); reading and
writing a model directory is :mod:`.directory`; the thresholds file is :mod:`.calibration`."""

from bayesgate.models.store.calibration import Calibration, read_calibration, write_calibration
from bayesgate.models.store.card import InferenceSettings, InputSpec, ModelCard, TrainingRecord
from bayesgate.models.store.directory import (
    LoadedModel,
    ModelStoreError,
    load_model,
    read_card,
    save_model,
    write_card,
)

__all__ = [
    "Calibration",
    "InferenceSettings",
    "InputSpec",
    "LoadedModel",
    "ModelCard",
    "ModelStoreError",
    "TrainingRecord",
    "load_model",
    "read_calibration",
    "read_card",
    "save_model",
    "write_calibration",
    "write_card",
]
