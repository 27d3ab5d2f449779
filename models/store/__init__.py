"""The model store: a directory with ``model.safetensors``, ``card.json`` and ``calibration.json``,
sha256-verified, rebuilt from the card (no pickle). The card is typed (:mod:`.card`); reading and
writing a model directory is :mod:`.directory`; the thresholds file is :mod:`.calibration`.

The names below are imported on first use: importing a light submodule (``.bundled``, which the
service's settings and ``bayesgate serve``'s checks read, or ``.files``, the names of a model
directory's files) does not import torch, so a setting that cannot work is refused in a fraction
of a second instead of after torch has loaded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bayesgate.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, __getattr__ below
    from bayesgate.models.store.calibration import (
        Calibration,
        read_calibration,
        write_calibration,
    )
    from bayesgate.models.store.card import (
        InferenceSettings,
        InputSpec,
        ModelCard,
        TrainingRecord,
    )
    from bayesgate.models.store.directory import (
        LoadedModel,
        ModelStoreError,
        load_model,
        read_card,
        save_model,
        write_card,
    )

_SOURCES = {
    "Calibration": "calibration",
    "read_calibration": "calibration",
    "write_calibration": "calibration",
    "InferenceSettings": "card",
    "InputSpec": "card",
    "ModelCard": "card",
    "TrainingRecord": "card",
    "LoadedModel": "directory",
    "ModelStoreError": "directory",
    "load_model": "directory",
    "read_card": "directory",
    "save_model": "directory",
    "write_card": "directory",
}

__all__ = [  # the names of _SOURCES (a test checks that each resolves)
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

__getattr__, __dir__ = lazy_names(__name__, _SOURCES, globals())
