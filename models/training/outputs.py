"""Which model directories a checkpoint's run wrote: ``outputs.json`` beside ``checkpoint.json``.

``bayesgate train --resume`` may write over the model in ``--out`` only when that model is the
one this checkpoint's run wrote there — same name is not enough: the default checkpoint
directory is keyed by the model's name alone, so two runs of one preset with different data or
epochs share it. After every finished run the CLI records ``{"out": <resolved --out>,
"weights_sha256": <the card's>}`` here; a fresh run starts the file empty. A checkpoint written
before this file existed has none, and :func:`wrote` then answers None (unknown).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bayesgate.models.training.checkpoint import CheckpointError, atomic_write

OUTPUTS_FILE = "outputs.json"


def _read(directory: Path) -> list[dict[str, str]] | None:
    path = directory / OUTPUTS_FILE
    if not path.is_file():
        return None
    try:
        records = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise CheckpointError(f"{path} is not a list of output records")
    return records


def _write(directory: Path, records: list[dict[str, str]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / OUTPUTS_FILE, (json.dumps(records, indent=1) + "\n").encode())


def start(directory: Path) -> None:
    """A fresh run in ``directory``: no model written yet (an empty record)."""
    _write(directory, [])


def record(directory: Path, out: Path, weights_sha256: str, *, replace: bool = False) -> None:
    """The run of ``directory`` wrote the weights ``weights_sha256`` into ``out``; ``replace``:
    forget the earlier records (the run started afresh over an older, finished checkpoint)."""
    entry = {"out": str(out.resolve()), "weights_sha256": weights_sha256}
    earlier = [] if replace else _read(directory) or []
    records = [r for r in earlier if r.get("out") != entry["out"]]
    _write(directory, [*records, entry])


def wrote(directory: Path, out: Path, weights_sha256: str) -> bool | None:
    """Whether the run of ``directory`` wrote the model now in ``out`` (these weights there);
    None when the checkpoint keeps no record (written before records were kept)."""
    records = _read(directory)
    if records is None:
        return None
    entry = {"out": str(out.resolve()), "weights_sha256": weights_sha256}
    return any(r.get("out") == entry["out"] and r.get("weights_sha256") == weights_sha256
               for r in records)  # fmt: skip


def written(directory: Path) -> list[str]:
    """The ``--out`` directories the run of ``directory`` wrote (for messages)."""
    return [str(r.get("out")) for r in _read(directory) or []]


def starting_at_first_epoch(
    directory: Path, on_epoch: Callable[[Any], None] | None
) -> Callable[[Any], None]:
    """``on_epoch`` that first empties the record, once: ``train()`` calls it right after an
    epoch's checkpoint is written, so the record is cleared when the new run's checkpoint has
    replaced the old run's — not before (a run failing before its first epoch leaves the old
    checkpoint and its record as they were)."""
    started = False

    def hook(row: Any) -> None:
        nonlocal started
        if not started:
            start(directory)
            started = True
        if on_epoch is not None:
            on_epoch(row)

    return hook
