"""Tables of implementations keyed by names that are declared without torch.

A command offers names (``calibrate --score``, ``detect-eval --ood``, …) and checks them from a
torch-free module, so that its ``--help`` and its refusals do not wait for torch (~3 s); the module
that implements them (torch) keeps a table name → implementation. :func:`keyed_by` checks, when
that module is imported, that its table implements exactly the declared names in their order: the
names are declared once, and the table cannot drift from them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def keyed_by(names: Sequence[str], table: dict[str, T], what: str) -> dict[str, T]:
    """``table`` itself, once checked to have exactly ``names`` as its keys, in that order
    (``TypeError`` naming ``what`` otherwise)."""
    if list(table) != list(names):
        raise TypeError(
            f"the {what} implemented ({', '.join(table)}) are not those declared "
            f"({', '.join(names)}), in that order"
        )
    return table
