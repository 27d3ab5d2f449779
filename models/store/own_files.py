"""Checks that commands reading a model make before the work, without torch.

- :func:`refuse_model_file`: an output flag (``evaluate --json``, ``predict --out``,
  ``attack --out``) must not name one of the files the model store reads from the model's
  directory (:data:`MODEL_FILES`) — by any path: relative, through a symlink, or a hard link.
  Written there, the output replaced the model's card, weights, calibration or detector, and the
  model no longer loaded.
- :func:`no_validation_split`, :func:`check_split`: the one line for a model trained with
  ``--val-size 0`` asked for its validation split (``calibrate``, ``evaluate`` and
  ``attack --split val``);
- :func:`check_distinct_models`: the commands that take several
  models (``evaluate-robust``, ``sweep``) refuse one given twice, named as the user gave it (a
  bundled model's name, not the package's directory it stands for).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bayesgate.errors import InvalidArgument
from bayesgate.models.store.files import (
    CALIBRATION_FILE,
    CARD_FILE,
    DETECTOR_JSON,
    DETECTOR_TENSORS,
    WEIGHTS_FILE,
)

MODEL_FILES = (CARD_FILE, WEIGHTS_FILE, CALIBRATION_FILE, DETECTOR_JSON, DETECTOR_TENSORS)
"""The files of a model directory that loading the model reads."""


def model_file_named(path: Path, model_dir: Path) -> str | None:
    """The name of the file of :data:`MODEL_FILES` in ``model_dir`` that ``path`` is (resolved:
    relative paths, ``..`` and symlinks; the same file by a hard link), else ``None``."""
    target = Path(path).resolve()
    folder = Path(model_dir).resolve()
    for name in MODEL_FILES:
        own = folder / name
        if target == own.resolve():
            return name
        try:
            if os.path.samefile(target, own):
                return name
        except OSError:  # either does not exist (yet): not the same file
            continue
    return None


def refuse_model_file(path: Path, model_dir: Path, flag: str) -> None:
    """:class:`InvalidArgument` naming ``flag`` when ``path`` is one of the model's own files
    (:func:`model_file_named`): call it before the work, as the other output checks."""
    name = model_file_named(path, model_dir)
    if name is not None:
        raise InvalidArgument(
            f"{flag} {path}: is the model's own {name} (in {model_dir}); writing there would "
            "replace it and the model would no longer load: name another file"
        )


def no_validation_split(name: str, purpose: str = "calibrate on") -> str:
    """The message for model ``name``, trained without a validation split, asked for it
    (``purpose``: what the held-out images were to be used for)."""
    return (
        f"model {name} was trained without a validation split (val_size 0): there are "
        f"no held-out images to {purpose}"
    )


def check_split(split: str, name: str, val_size: int, purpose: str) -> None:
    """:class:`InvalidArgument` when ``split`` is ``"val"`` and model ``name`` was trained without
    a validation split (``val_size`` 0): :func:`no_validation_split`'s line, for ``--split``."""
    if split == "val" and val_size <= 0:
        raise InvalidArgument(
            f"--split val: {no_validation_split(name, purpose)}; use --split test"
        )


def check_distinct_models(paths: Sequence[Path], given: Sequence[str] | None = None) -> None:
    """:class:`InvalidArgument` naming the first model directory given twice (also as another
    spelling of the same folder: ``m``, ``./m``, an absolute path, a symbolic link): the commands
    that take several models (``evaluate-robust``, ``sweep``) would evaluate it twice, and write
    two identical rows. ``given``: what the user typed for each path, where that is not the path
    itself (a bundled model's name: the line names it, its directory in parentheses). Torch-free,
    so it answers before torch's import."""
    typed = [str(Path(p)) for p in paths] if given is None else [str(Path(t)) for t in given]
    seen: dict[Path, str] = {}
    for path, text in zip(paths, typed, strict=True):
        key = Path(path).resolve()
        if key in seen:
            raise InvalidArgument(_given_twice(Path(path), text, seen[key]))
        seen[key] = text


def _given_twice(path: Path, text: str, first: str) -> str:
    """The line of :func:`check_distinct_models`: the model as typed (``text``; ``first``: its
    earlier spelling), and the directory ``path`` it stands for when that is not what was typed."""
    what = f"directory {text}" if text == str(path) else f"{text} ({path})"
    same = "" if first == text else f" (as {first} and {text})"
    return f"model {what} given twice{same}: give each model once"
