"""``bayesgate train --init-from MODEL``: start from a trained model's weights (fine-tuning).

The model's card must describe the architecture the run builds (the preset with ``--p``):
:func:`init_source` checks that from the card alone, before any data is read, and
refuses in one line naming the first setting that differs. :func:`load_init_weights` then loads
the weights (their sha256 checked against the card, as every model load does) into the freshly
built network. The run records where it started — the model's name, directory and weights'
sha256 — in its card (``training.init_from``) and in its checkpoint's settings, so a resumed run
must start from the same weights.

Only the weights carry over: the optimiser starts afresh (its state is not part of a model
directory), and the run counts its own epochs from 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bayesgate.errors import InvalidArgument, ModelStoreError

if TYPE_CHECKING:
    from torch import nn


def init_source(model: Path, arch: dict[str, Any], preset: str) -> dict[str, str]:
    """The record of ``model`` as a starting point (``name``, ``directory``, ``weights_sha256``),
    after checking that its card describes ``arch``; :class:`InvalidArgument` otherwise."""
    from bayesgate.models.store.bundled import resolve_model_dir
    from bayesgate.models.store.directory import read_card

    directory = resolve_model_dir(model)
    try:
        card = read_card(directory)
    except ModelStoreError as exc:
        raise InvalidArgument(f"--init-from: {exc}") from exc
    first = ("type", "preset")  # the difference that names the others
    for key in sorted(set(arch) | set(card.architecture), key=lambda k: (k not in first, k)):
        if arch.get(key) != card.architecture.get(key):
            raise InvalidArgument(
                f"--init-from {model}: its architecture has {key}="
                f"{card.architecture.get(key)!r}, the run's (--preset {preset}) {key}="
                f"{arch.get(key)!r}; choose the preset (and --p) the model was trained with"
            )
    return {"name": card.name, "directory": str(directory), "weights_sha256": card.weights_sha256}


def load_init_weights(network: nn.Module, source: dict[str, str]) -> None:
    """Load the weights of ``source`` (from :func:`init_source`) into ``network``, checking that
    the file is still the one the record names."""
    from bayesgate.models.store.directory import load_model

    loaded = load_model(source["directory"])
    if loaded.card.weights_sha256 != source["weights_sha256"]:
        raise ModelStoreError(
            f"--init-from {source['directory']}: the weights changed since the run was checked "
            f"({loaded.card.weights_sha256[:16]}… against {source['weights_sha256'][:16]}…)"
        )
    network.load_state_dict(loaded.network.state_dict(), strict=True)
