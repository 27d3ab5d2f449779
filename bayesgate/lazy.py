"""Package names imported on first use (PEP 562's module ``__getattr__`` and ``__dir__``).

A package whose submodules import torch lists its public names with the submodule each comes
from; importing the package (or one of its light submodules, which a command's ``--help`` reads)
then imports none of them. The package keeps ``TYPE_CHECKING`` imports of the same names for type
checkers, and an ``__all__`` that a test resolves name by name (``tests/test_cli_imports.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, sources: Mapping[str, str], namespace: Mapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``package.NAME`` is ``NAME`` of the submodule
    ``package.<sources[NAME]>``, imported when first asked for; ``dir(package)`` lists the
    module's own ``namespace`` (its ``globals()``) and every lazy name."""

    def __getattr__(name: str) -> Any:
        source = sources.get(name)
        if source is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{source}"), name)

    def __dir__() -> list[str]:
        return sorted({*namespace, *sources})

    return __getattr__, __dir__
