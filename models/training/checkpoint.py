"""Training checkpoints: everything a run needs to continue bit-identically, without pickle.

A checkpoint directory holds two kinds of file:

- ``epoch-NNNN.safetensors`` — the tensors: the model's state (``model.*``), the optimiser's
  per-parameter state (``optimizer.<param index>.<name>``, e.g. Adam's ``exp_avg``, ``step``)
  and, with early stopping, the best weights so far (``best.*``);
- ``checkpoint.json`` — everything else: the settings the run was started with, the epoch
  reached, the history, the early-stopping state, the optimiser's param groups, the LR
  scheduler's state and the RNG states (torch CPU, CUDA, the data-order generator) as base64.

Both are written to a temporary file, fsync'ed and renamed (then the directory is fsync'ed);
``checkpoint.json`` is written last and names its tensor file and that file's sha256, so a
crash at any moment leaves the previous complete checkpoint in force. Loading reads JSON and
safetensors only — never ``torch.load``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from bayesgate.errors import UserError
from bayesgate.outputs import write_atomically

STATE_FILE = "checkpoint.json"
FORMAT = "bayesgate-checkpoint/1"


class CheckpointError(UserError, ValueError):
    """A checkpoint is missing, corrupt, or was written by a run with other settings (a user
    error: ``bayesgate`` prints it as one line)."""


@dataclass
class Checkpointing:
    """Where a run keeps its checkpoint and whether to continue from it.

    ``settings`` are extra run settings (architecture, data) that must equal the checkpoint's on
    resume, besides the :class:`~bayesgate.models.training.config.TrainConfig` fields."""

    directory: Path
    resume: bool = False
    settings: dict[str, Any] = field(default_factory=dict)


# --- atomic files -----------------------------------------------------------------------------


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file: write, fsync, rename, fsync the folder."""
    write_atomically(path, lambda out: out.write(data), binary=True, fsync=True)


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor], state: dict) -> None:
    """Write one checkpoint (see the module docstring) and delete older tensor files."""
    directory.mkdir(parents=True, exist_ok=True)
    blob = save_safetensors({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    name = f"epoch-{state['epoch']:04d}.safetensors"
    atomic_write(directory / name, blob)
    state = {
        "format": FORMAT,
        **state,
        "tensors": name,
        "tensors_sha256": hashlib.sha256(blob).hexdigest(),
    }
    atomic_write(directory / STATE_FILE, (json.dumps(state, indent=1) + "\n").encode())
    for old in directory.glob("epoch-*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)


def read_checkpoint(directory: Path) -> tuple[dict[str, torch.Tensor], dict] | None:
    """``(tensors, state)`` of the checkpoint in ``directory``, or None if there is none."""
    path = directory / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} file")
    blob_path = directory / str(state.get("tensors"))
    try:
        blob = blob_path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"checkpoint tensors missing: {exc}") from exc
    if hashlib.sha256(blob).hexdigest() != state.get("tensors_sha256"):
        raise CheckpointError(f"{blob_path} does not match the sha256 in {path}")
    return load_safetensors(blob), state


def is_finished(state: dict) -> bool:
    """Whether a checkpoint's state is of a run that ended (stopped early or all its epochs)."""
    progress = state["progress"]
    return bool(progress["stopped"]) or progress["epoch"] >= state["epochs"]


def finished_run_in(directory: Path) -> bool:
    """Whether ``directory`` holds the checkpoint of a run that ended (its JSON state only; a
    state that does not read counts as not finished — the run itself then says why)."""
    try:
        state = json.loads((directory / STATE_FILE).read_text())
        return is_finished(state)
    except (OSError, ValueError, KeyError, TypeError):
        return False


# --- settings ---------------------------------------------------------------------------------


def check_same_settings(saved: dict[str, Any], current: dict[str, Any], directory: Path) -> None:
    """Refuse to resume when any setting differs; the message names the first difference."""
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            raise CheckpointError(
                f"the checkpoint in {directory} was written with {key}={saved.get(key)!r}, "
                f"this run has {key}={current.get(key)!r}; resume with the same settings "
                "or use another --checkpoint-dir"
            )


# --- optimiser state --------------------------------------------------------------------------


def split_optimizer_state(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """``optimizer.state_dict()`` → (tensors keyed ``optimizer.<param>.<name>``, JSON rest)."""
    tensors: dict[str, torch.Tensor] = {}
    others: dict[str, dict[str, Any]] = {}
    for index, entries in state["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{name}"] = value
            else:
                others.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": state["param_groups"], "other_state": others}


def join_optimizer_state(tensors: dict[str, torch.Tensor], saved: dict) -> dict:
    """Inverse of :func:`split_optimizer_state` (input for ``optimizer.load_state_dict``)."""
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            index, name = key[len("optimizer.") :].split(".", 1)
            per_param.setdefault(int(index), {})[name] = value
    for index, entries in saved["other_state"].items():
        per_param.setdefault(int(index), {}).update(entries)
    return {"state": per_param, "param_groups": saved["param_groups"]}


def prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``tensors`` under ``prefix + "."``, with the prefix removed."""
    start = len(prefix) + 1
    return {k[start:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


# --- RNG states -------------------------------------------------------------------------------


def rng_states(data_order: torch.Generator) -> dict[str, Any]:
    """The RNG states a training run draws from, as base64 of their byte tensors."""
    states = {
        "torch_cpu": _b64(torch.get_rng_state()),
        "data_order": _b64(data_order.get_state()),
    }
    if torch.cuda.is_available():
        states["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return states


def restore_rng_states(states: dict[str, Any], data_order: torch.Generator) -> None:
    """Inverse of :func:`rng_states`."""
    torch.set_rng_state(_unb64(states["torch_cpu"]))
    data_order.set_state(_unb64(states["data_order"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in states["cuda"]])


def _b64(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
