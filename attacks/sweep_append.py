"""``bayesgate sweep --append``: which earlier model each model of this run is.

The results file records each model's directory (resolved) and weights' sha256 beside its label
(``model``) and ``name`` (:func:`bayesgate.attacks.sweep.describe`). A model of this run is the
earlier run's model when it has the same directory (re-run, retrained in place or not) or the same
weights (a copy): it takes that model's label and name, so its rows replace the earlier ones, as
before. Any other model whose label or name an earlier model has is told apart — its label gets
its card name in parentheses, else its directory's name (else ``#2``, ``#3``…), its name
``-<directory name>`` — never merged into that model's line, rows or ROC file. The earlier
models keep their labels.

Files written before the directories were recorded (2026-11-30) are read as they are: there an
earlier model is recognised by its weights' sha256 alone, so a model retrained in place since is
added beside it (with a note) instead of replacing it.

Torch-free.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def same_model(info: dict[str, Any], earlier: dict[str, Any]) -> bool:
    """Whether ``info`` (of this run) is the ``earlier`` run's model: the same directory where
    the file records one, else the same weights."""
    directory = earlier.get("directory")
    if directory is not None and directory == info.get("directory"):
        return True
    sha = earlier.get("sha256")
    return sha is not None and sha == info.get("sha256")


def _match(info: dict[str, Any], earlier: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The earlier model ``info`` is (its directory first, then its weights), else ``None``."""
    directory = info.get("directory")
    same_dir = [d for d in earlier if directory is not None and d.get("directory") == directory]
    found = same_dir or [d for d in earlier if same_model(info, d)]
    return found[0] if found else None


def _free(candidates: Iterable[str], base: str, sep: str, taken: set[str]) -> str:
    """The first of ``candidates`` not ``taken``, else ``base`` + ``sep`` + 2, 3, …"""
    for value in candidates:
        if value not in taken:
            return value
    n = 2
    while f"{base}{sep}{n}" in taken:
        n += 1
    return f"{base}{sep}{n}"


def _told_apart(info: dict[str, Any], labels: set[str], names: set[str]) -> dict[str, Any]:
    """``info`` with a label and a name that are not in ``labels`` and ``names`` (unchanged where
    they are not)."""
    folder = Path(str(info.get("directory", ""))).name
    label, name = info["model"], info["name"]
    if label in labels:  # its card name where no earlier model has it, else its directory's
        candidates = [] if name in names else [f"{label} ({name})"]
        label = _free([*candidates, f"{label} ({folder})"], label, " #", labels)
    if name in names:
        name = _free([f"{name}-{folder}"], name, "-", names)
    return {**info, "model": label, "name": name}


def fit_to_earlier(
    infos: Sequence[dict[str, Any]], earlier: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """This run's model descriptions (:func:`bayesgate.attacks.sweep.describe_models`) fitted to
    the ``earlier`` run's (its results file's ``models``): a model that is an earlier one takes
    its label and name (its rows replace that model's), any other gets a label and a name that no
    model of the merged results has. Also a note for each model told apart from an earlier one."""
    fitted: list[dict[str, Any] | None] = [None] * len(infos)
    unclaimed = list(earlier)
    for i, info in enumerate(infos):
        old = _match(info, unclaimed)
        if old is not None:
            unclaimed.remove(old)
            fitted[i] = {**info, "model": old["model"], "name": old["name"]}
    labels = {d["model"] for d in unclaimed} | {d["model"] for d in fitted if d is not None}
    names = {d["name"] for d in unclaimed} | {d["name"] for d in fitted if d is not None}
    notes = []
    for i, info in enumerate(infos):
        if fitted[i] is not None:
            continue
        new = _told_apart(info, labels, names)
        if (new["model"], new["name"]) != (info["model"], info["name"]):
            notes.append(_note(info, new))
        labels.add(new["model"])
        names.add(new["name"])
        fitted[i] = new
    return [d for d in fitted if d is not None], notes


def _note(info: dict[str, Any], new: dict[str, Any]) -> str:
    """The line telling that ``info``'s model is not the earlier one of its label or name."""
    where = info.get("directory", info["name"])
    return (
        f"sweep --append: {where} is not the earlier run's {info['model']} ({info['name']}), "
        f"neither its directory nor its weights: added beside it as {new['model']} ({new['name']})"
    )


def print_notes(notes: Sequence[str]) -> None:
    """Each note on stderr, one line each."""
    for note in notes:
        print(note, file=sys.stderr)
