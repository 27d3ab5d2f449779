"""Optional dependencies (the extras of ``pyproject.toml``), checked before a command works.

A command that needs an optional module declares it with ``set_defaults(needs=FUNCTION)``, where
``FUNCTION(args)`` returns :class:`Need` items (what needs which module); :func:`bayesgate.cli.main`
checks them with :func:`missing_need` before it runs the command, so a slim install
(``pip install .``) ends with one line naming the command, the module and the ``pip install`` to
run — not a ``ModuleNotFoundError`` after minutes of work. Only the module's spec is looked up
(:func:`importlib.util.find_spec`): nothing heavy is imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.util import find_spec
from typing import NamedTuple

from bayesgate.errors import UserError

EXTRA_OF = {
    "cleverhans": "attacks",
    "matplotlib": "attacks",
    "grpc": "grpc",
    "tritonclient": "grpc",
    "ray": "ray",
}
"""Top-level module → the ``bayesgate[EXTRA]`` that installs it."""


class Need(NamedTuple):
    """``what`` (e.g. ``"--attack fgs"``, ``"the report"``) imports ``module`` when it runs."""

    module: str
    what: str


class MissingExtra(UserError):
    """An optional dependency of the command is not installed (one line, exit code 2)."""


def module_available(name: str) -> bool:
    """Whether ``name`` (dotted names too) can be imported, without importing it (only its
    parent packages, for a dotted name)."""
    try:
        return find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def install_hint(module: str) -> str:
    extra = EXTRA_OF.get(module.split(".")[0])
    return f"pip install 'bayesgate[{extra}]'" if extra else f"pip install {module.split('.')[0]}"


def missing_message(what: str, module: str) -> str:
    """``WHAT needs the EXTRA extra (MODULE is not installed): pip install 'bayesgate[EXTRA]'``."""
    top = module.split(".")[0]
    extra = EXTRA_OF.get(top)
    needs = f"the {extra} extra" if extra else top
    return f"{what} needs {needs} ({top} is not installed): {install_hint(module)}"


def missing_need(needs: Iterable[Need]) -> Need | None:
    """The first need whose module cannot be imported, else None."""
    return next((need for need in needs if not module_available(need.module)), None)


def check_needs(command: str, needs: Iterable[Need]) -> None:
    """Raise :class:`MissingExtra` naming ``command``, what needs the module, the module and the
    extra when one of ``needs`` is not installed."""
    need = missing_need(needs)
    if need is not None:
        what = f"{command}: {need.what}" if need.what else command
        raise MissingExtra(missing_message(what, need.module))
