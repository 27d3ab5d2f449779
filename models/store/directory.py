"""Model store: one directory per model holding ``model.safetensors`` and ``card.json``.

The card (:mod:`bayesgate.models.store.card`) records everything needed to rebuild the network
(architecture dict), how it was trained, its input spec, metrics and the sha256 of the weights
file. Loading rebuilds the network from the card, verifies the sha256 and loads the weights with
safetensors — no pickle is ever read.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from bayesgate.errors import ModelStoreError
from bayesgate.models.networks.registry import build_network
from bayesgate.models.store.bundled import (
    BUNDLED_MODELS_DIR,
    DEFAULT_ALIAS,
    bundled_model_names,
    resolve_model_dir,
)
from bayesgate.models.store.card import CARD_FORMAT, ModelCard
from bayesgate.models.store.checks import (
    MAX_JSON_DEPTH,
    architecture_problem,
    check_input_and_classes,
    first_line,
    json_value_problem,
    parse_int,
    state_mismatch,
)
from bayesgate.models.store.files import CALIBRATION_FILE, CARD_FILE, WEIGHTS_FILE
from bayesgate.outputs import write_atomically

__all__ = [  # the card and the error are re-exported for the store's users
    "CALIBRATION_FILE",
    "CARD_FILE",
    "CARD_FORMAT",
    "WEIGHTS_FILE",
    "LoadedModel",
    "ModelCard",
    "ModelStoreError",
    "load_model",
    "read_card",
    "save_model",
    "write_card",
]


@dataclass
class LoadedModel:
    """A network rebuilt from the store, on its device, in eval mode, with its card."""

    network: nn.Module
    card: ModelCard
    directory: Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_version() -> str:
    """Package version plus the git commit when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("bayesgate")
    except PackageNotFoundError:
        v = "0+unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        return f"{v}+g{commit}"
    except (OSError, subprocess.SubprocessError):
        return v


def save_model(network: nn.Module, card: ModelCard, directory: Path | str) -> ModelCard:
    """Write ``model.safetensors`` and ``card.json`` into ``directory`` (created if needed).

    Fills ``weights_sha256``, ``code_version`` and ``created``; returns the card as written. Files
    are written to temporaries and renamed, so a crash never leaves a half-written model.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").contiguous() for k, v in network.state_dict().items()}
    blob = canonical_safetensors(
        save_safetensors(state, metadata={"format": CARD_FORMAT, "name": card.name})
    )
    card.weights_sha256 = hashlib.sha256(blob).hexdigest()
    card.code_version = card.code_version or code_version()
    card.created = card.created or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    _atomic_write(directory / WEIGHTS_FILE, blob)
    _atomic_write(directory / CARD_FILE, card.to_json().encode())
    return card


def canonical_safetensors(blob: bytes) -> bytes:
    """The same safetensors file with its JSON header in one canonical form (keys sorted, no
    spaces, padded with spaces to a multiple of 8 bytes), so the sha256 of the file depends only
    on the tensors and the metadata — safetensors writes ``__metadata__`` in hash-map order, which
    differs between runs. Tensor data and offsets are unchanged (they are relative to the end of
    the header)."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + blob[8 + size :]


def read_json_object(path: Path, missing: str, kind: str) -> dict[str, Any]:
    """The JSON object in ``path``; ``ModelStoreError`` naming the file otherwise.

    ``missing`` completes the message when the file does not exist; ``kind`` names what the
    file should be (e.g. "a model card"). Content no reader of the store can use is refused here,
    naming its field: nesting deeper than :data:`MAX_JSON_DEPTH`, an integer outside the signed
    64-bit range, a string that is not valid Unicode (a lone surrogate escape such as
    ``"\\ud800"``).
    """
    if not path.is_file():
        raise ModelStoreError(f"{path}: {missing}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelStoreError(f"{path}: cannot read the file ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ModelStoreError(f"{path}: not valid JSON ({exc})") from exc
    try:
        data = json.loads(text, parse_int=parse_int)
    except RecursionError:
        raise ModelStoreError(
            f"{path}: not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)"
        ) from None
    except ValueError as exc:  # JSONDecodeError, or a number json cannot convert
        raise ModelStoreError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ModelStoreError(f"{path}: not {kind} (expected a JSON object)")
    problem = json_value_problem(data)
    if problem is not None:
        raise ModelStoreError(f"{path}: {problem}")
    return data


def read_card(directory: Path | str) -> ModelCard:
    """Parse and check ``card.json`` of a model directory."""
    path = Path(directory) / CARD_FILE
    missing = f"model card not found (is {directory} a model directory?)"
    # only for a card that is not there: a bundled model's name given where a directory is needed
    if not path.is_file() and resolve_model_dir(Path(directory)) != Path(directory):
        missing = (
            f"model card not found: {directory} is a bundled model's name, not a model directory "
            "here; to read it from Python, resolve the name first (bayesgate.models.store.bundled."
            "resolve_model_dir, as Gate.load and the commands that only read a model do); the "
            "commands that write into the model directory (calibrate, fit-detector, evaluate "
            f"--write-card) need a copy of your own (from {BUNDLED_MODELS_DIR})"
        )
    elif len(Path(directory).parts) == 1 and not Path(directory).exists():
        names = ", ".join([*bundled_model_names(), DEFAULT_ALIAS])
        missing = (
            f"model card not found: {directory} is neither a model directory here nor a bundled "
            f"model's name ({names})"
        )
    data = read_json_object(path, missing, "a model card")
    return ModelCard.from_dict(data, source=str(path))


def write_card(card: ModelCard, directory: Path | str) -> None:
    """Rewrite ``card.json`` (e.g. after evaluation added metrics); weights are untouched."""
    _atomic_write(Path(directory) / CARD_FILE, card.to_json().encode())


def load_model(directory: Path | str, device: torch.device | str = "cpu") -> LoadedModel:
    """Rebuild the network from the card, verify the weights' sha256 and load them.

    Every problem with the directory is one :class:`ModelStoreError` naming the file and the
    field: the card's architecture numbers are checked before anything is built, the network is
    first built without memory (``meta`` device) and its tensor shapes compared with the weights
    file, and after loading one blank input of the card's ``input.shape`` must run through the
    network and give one output per name in the card's ``classes``.
    """
    directory = Path(directory)
    card = read_card(directory)
    card_path = directory / CARD_FILE
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise ModelStoreError(f"{weights}: weights file not found")
    try:
        blob = weights.read_bytes()
    except OSError as exc:
        raise ModelStoreError(f"{weights}: cannot read the file ({exc.strerror or exc})") from exc
    digest = hashlib.sha256(blob).hexdigest()
    if digest != card.weights_sha256:
        raise ModelStoreError(
            f"{weights}: sha256 {digest[:16]}… does not match the card's "
            f"{card.weights_sha256[:16]}… "
            "(file truncated or tampered with)"
        )
    try:
        state = load_safetensors(blob)
    except (SafetensorError, ValueError) as exc:
        raise ModelStoreError(f"{weights}: not a valid safetensors file ({exc})") from exc
    problem = architecture_problem(card.architecture)
    if problem is not None:
        raise ModelStoreError(f"{card_path}: {problem}")
    with torch.device("meta"):  # shapes only: nothing allocated whatever the card says
        skeleton = _build(card.architecture, card_path)
    mismatch = state_mismatch(skeleton, state)
    if mismatch is not None:
        raise ModelStoreError(f"{weights}: weights do not fit the card's architecture ({mismatch})")
    network = _build(card.architecture, card_path)
    try:
        network.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelStoreError(
            f"{weights}: weights do not fit the card's architecture ({first})"
        ) from exc
    network.eval()
    check_input_and_classes(network, card, card_path)
    network.to(device)
    return LoadedModel(network=network, card=card, directory=directory)


def _build(arch: dict[str, Any], card_path: Path) -> nn.Module:
    """:func:`build_network`, with what the architecture's values make the constructor raise
    as a :class:`ModelStoreError` naming the card."""
    try:
        return build_network(arch)
    except (ValueError, TypeError, KeyError, RuntimeError, OverflowError) as exc:
        line = first_line(str(exc), 300) or type(exc).__name__
        where = "" if line.startswith("architecture") else "architecture: "
        raise ModelStoreError(f"{card_path}: {where}{line}") from exc


def _atomic_write(path: Path, data: bytes) -> None:
    write_atomically(path, lambda out: out.write(data), binary=True)
