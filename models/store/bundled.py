"""The models shipped inside the package (``models/pretrained/``) and their names.

A command that reads a model (``serve``, ``evaluate``, ``attack``, ``detect-eval``,
``adaptive-eval``, ``evaluate-robust``) takes a model directory or, where no such directory
exists, a bundled model's name: ``bayesgate-robust``, ``bayesgate-cnn``, or ``bayesgate-default``
for the default one — so they work the same from a source checkout and from an installed package.
Commands that write into the model directory (``calibrate``, ``fit-detector``,
``evaluate --write-card``) take directories only: the installed package is not theirs to change.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bayesgate import models
from bayesgate.models.store.files import CARD_FILE

BUNDLED_MODELS_DIR = Path(models.__file__).parent / "pretrained"
# The adversarially trained model: same clean accuracy as the CNN, robust at ε = 0.3, and an
# informed attacker gets through its flag on ~1 % of digits instead of ~99 % (docs/robustness.md).
DEFAULT_MODEL_DIR = BUNDLED_MODELS_DIR / "bayesgate-robust"
DEFAULT_ALIAS = "bayesgate-default"  # names whichever bundled model is the default


def bundled_model_names() -> list[str]:
    """Names of the model directories shipped inside the package (``bayesgate-cnn``, …)."""
    return sorted(d.name for d in BUNDLED_MODELS_DIR.iterdir() if (d / CARD_FILE).is_file())


def resolve_model_dir(path: Path) -> Path:
    """``path`` itself, or — when it is a bare name that is not a directory here but names a
    bundled model (``bayesgate-robust``, ``bayesgate-cnn``, or ``bayesgate-default`` for the
    default one) — that bundled model's directory."""
    if len(path.parts) != 1 or path.is_dir():
        return path
    if path.name == DEFAULT_ALIAS:
        return DEFAULT_MODEL_DIR
    bundled = BUNDLED_MODELS_DIR / path.name
    return bundled if (bundled / CARD_FILE).is_file() else path


def model_to_read(text: str) -> Path:
    """``argparse`` type of a model a command only reads: a directory or a bundled name."""
    return resolve_model_dir(Path(text))


class ModelsToRead(argparse.Action):
    """``argparse`` action of the models a command that takes several only reads: each resolved
    by :func:`model_to_read` (``dest``), and what the user typed kept beside them
    (``<dest>_given``), so that an error names a bundled model as given, not by the package's
    directory it stands for."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given = [values] if isinstance(values, str) else [str(v) for v in values or []]
        setattr(namespace, self.dest, [model_to_read(text) for text in given])
        setattr(namespace, f"{self.dest}_given", given)


READ_MODEL_HELP = "model directory, or a bundled model's name (bayesgate-robust, bayesgate-cnn)"


def model_dir_not_found(path: Path, source: str) -> str:
    """The one line for a model directory that does not exist, naming where it came from
    (``--model-dir``, ``BAYESGATE_MODEL_DIR``) and what else it may be."""
    names = ", ".join(bundled_model_names())
    return (
        f"{source} {path}: model directory not found (give a model directory or a bundled "
        f"model's name: {names}, or {DEFAULT_ALIAS})"
    )
