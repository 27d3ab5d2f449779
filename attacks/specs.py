"""Attack specifications: strings like ``fgs:eta=0.2`` parsed into attack objects.

Syntax ``NAME[:key=value[,key=value…]]``; ``NAME`` is a key of the registry
:data:`bayesgate.attacks.methods.ATTACKS`, the keys are the fields of its class and unspecified
ones take the class's defaults. Examples: ``fgs:eta=0.3``,
``targeted:steps=40,eta=0.01,target=0``, ``pgd:eps=0.3``, ``cw:iterations=100``. An attack's
:attr:`~bayesgate.attacks.methods.Attack.key` is the canonical spec (every parameter), and
``parse_attack(attack.key) == attack``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bayesgate.attacks.methods import ATTACKS, Attack
from bayesgate.attacks.methods.base import parameter_defaults
from bayesgate.errors import InvalidArgument
from bayesgate.extras import Need

DEFAULT_ATTACKS = ("fgs:eta=0.1", "fgs:eta=0.2", "fgs:eta=0.3", "targeted:steps=40,eta=0.01")
"""What ``bayesgate calibrate`` evaluates unless told otherwise (PGD and CW are opt-in)."""


def attack_class(name: str) -> type[Attack]:
    """The registered class of ``name``; the error lists the registered names."""
    try:
        return ATTACKS[name]
    except KeyError:
        raise InvalidArgument(
            f"unknown attack {name!r}; choose one of {', '.join(ATTACKS)}"
        ) from None


def build_attack(name: str, params: Mapping[str, Any] | None = None) -> Attack:
    """``name``'s attack with ``params`` (strings or values; the rest default).

    Unknown parameters are an error listing the known ones; values are converted to the
    parameter's type and range-checked by the class.
    """
    cls = attack_class(name)
    params = dict(params or {})
    known = parameter_defaults(cls)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InvalidArgument(
            f"attack {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(known) or 'none'}"
        )
    return cls(**params)


def spec_needs(specs: Sequence[str]) -> list[Need]:
    """The optional modules the attacks named by ``specs`` import when they run (cleverhans for
    FGS, targeted, PGD and CW), found from the names alone: a spec that does not parse needs
    nothing here, its error comes from the parser."""
    needs = []
    for spec in specs:
        name = spec.strip().partition(":")[0].strip()
        cls = ATTACKS.get(name)
        needs += [Need(module, f"attack {name}") for module in (cls.requires if cls else ())]
    return needs


def parse_attack(text: str) -> Attack:
    """Parse ``NAME[:key=value,…]`` (see the module docstring)."""
    name, _, rest = text.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"attack {text!r}: expected key=value, got {item!r}")
        params[key.strip()] = value.strip()
    return build_attack(name.strip(), params)


def parse_attacks(texts: Sequence[str]) -> list[Attack]:
    """Parse several specs; duplicates are an error (they would collide in the results)."""
    attacks = [parse_attack(t) for t in texts]
    keys = [a.key for a in attacks]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise InvalidArgument(f"attack(s) listed twice: {', '.join(dupes)}")
    if not attacks:
        raise InvalidArgument("no attacks given")
    return attacks


def spec_help() -> str:
    """One line per registered attack, ``name: key=default, …`` (for ``--help``)."""
    return "; ".join(
        f"{name}: " + ", ".join(f"{k}={v}" for k, v in parameter_defaults(cls).items())
        for name, cls in ATTACKS.items()
    )
