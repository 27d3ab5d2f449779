"""Attack specifications: strings like ``fgs:eta=0.2`` parsed into attack objects.

Syntax ``NAME[:key=value[,key=value…]]``; ``NAME`` is a key of the registry
:data:`bayesgate.attacks.methods.ATTACKS`, the keys are the fields of its class and unspecified
ones take the class's defaults. Examples: ``fgs:eta=0.3``,
``targeted:steps=40,eta=0.01,target=0``, ``pgd:eps=0.3``, ``cw:iterations=100``. An attack's
:attr:`~bayesgate.attacks.methods.Attack.key` is the canonical spec (every parameter), and
``parse_attack(attack.key) == attack``.

Names, parameters, defaults and checks come from the attacks' torch-free parameter declarations
(:data:`~bayesgate.attacks.methods.parameters.ATTACK_PARAMETERS`): :func:`parse_parameters`,
:func:`parse_parameter_list`, :func:`spec_needs` and :func:`spec_help` do not import torch, so the
command line's help and its refusal of a bad spec answer at once; :func:`parse_attack`,
:func:`parse_attacks` and :func:`build_attack` check the same way, then import the attack classes
(torch) to build the attacks. The commands' default attack lists (:data:`DEFAULT_ATTACKS`,
:data:`DETECTION_ATTACKS`) are here too, for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bayesgate.attacks.methods.parameters import (
    ATTACK_PARAMETERS,
    AttackParameters,
    parameter_defaults,
)
from bayesgate.errors import InvalidArgument
from bayesgate.extras import Need

if TYPE_CHECKING:
    from bayesgate.attacks.methods import Attack

DEFAULT_ATTACKS = ("fgs:eta=0.1", "fgs:eta=0.2", "fgs:eta=0.3", "targeted:steps=40,eta=0.01")
"""What ``bayesgate calibrate`` evaluates unless told otherwise (PGD and CW are opt-in)."""
DETECTION_ATTACKS = (
    "fgs:eta=0.1",
    "fgs:eta=0.2",
    "fgs:eta=0.3",
    "targeted:steps=40,eta=0.01",
    "pgd:eps=0.3,eps_iter=0.01,steps=40",
    "cw:iterations=100,binary_steps=3,confidence=1",
)
"""What ``bayesgate sweep --figure detection`` runs unless told otherwise (the detection table's
attacks, :func:`bayesgate.attacks.sweep.detection`)."""


def parameters_class(name: str) -> type[AttackParameters]:
    """The registered parameters class of ``name``; the error lists the registered names."""
    try:
        return ATTACK_PARAMETERS[name]
    except KeyError:
        raise InvalidArgument(
            f"unknown attack {name!r}; choose one of {', '.join(ATTACK_PARAMETERS)}"
        ) from None


def attack_class(name: str) -> type[Attack]:
    """The registered class of ``name`` (imports the attacks: torch); the error lists the
    registered names."""
    parameters_class(name)
    from bayesgate.attacks.methods import ATTACKS

    return ATTACKS[name]


def build_parameters(name: str, params: Mapping[str, Any] | None = None) -> AttackParameters:
    """``name``'s parameters with ``params`` (strings or values; the rest default), checked,
    without torch.

    Unknown parameters are an error listing the known ones; values are converted to the
    parameter's type and range-checked by the class.
    """
    cls = parameters_class(name)
    params = dict(params or {})
    known = parameter_defaults(cls)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise InvalidArgument(
            f"attack {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"known: {', '.join(known) or 'none'}"
        )
    return cls(**params)


def build_attack(name: str, params: Mapping[str, Any] | None = None) -> Attack:
    """``name``'s attack with ``params``: :func:`build_parameters`'s checks, then the attack."""
    return attack_of(build_parameters(name, params))


def attack_of(parameters: AttackParameters) -> Attack:
    """The attack (its class imports torch) with these checked parameters."""
    return attack_class(parameters.name)(**parameters.params)


def spec_needs(specs: Sequence[str]) -> list[Need]:
    """The optional modules the attacks named by ``specs`` import when they run (cleverhans for
    FGS, targeted, PGD and CW), found from the names alone: a spec that does not parse needs
    nothing here, its error comes from the parser."""
    needs = []
    for spec in specs:
        name = spec.strip().partition(":")[0].strip()
        cls = ATTACK_PARAMETERS.get(name)
        needs += [Need(module, f"attack {name}") for module in (cls.requires if cls else ())]
    return needs


def parse_parameters(text: str) -> AttackParameters:
    """Parse ``NAME[:key=value,…]`` (see the module docstring) into the attack's checked
    parameters, without torch."""
    name, _, rest = text.strip().partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InvalidArgument(f"attack {text!r}: expected key=value, got {item!r}")
        if key.strip() in params:
            raise InvalidArgument(f"attack {text!r}: {key.strip()} given twice")
        params[key.strip()] = value.strip()
    return build_parameters(name.strip(), params)


def parse_attack(text: str) -> Attack:
    """Parse ``NAME[:key=value,…]`` (see the module docstring) into the attack."""
    return attack_of(parse_parameters(text))


def parse_parameter_list(texts: Sequence[str]) -> list[AttackParameters]:
    """Parse several specs into their checked parameters, without torch; duplicates are an error
    (they would collide in the results), and so is an empty list."""
    parameters = [parse_parameters(t) for t in texts]
    keys = [p.key for p in parameters]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise InvalidArgument(f"attack(s) listed twice: {', '.join(dupes)}")
    if not parameters:
        raise InvalidArgument("no attacks given")
    return parameters


def parse_attacks(texts: Sequence[str]) -> list[Attack]:
    """Parse several specs (:func:`parse_parameter_list`'s checks) into the attacks."""
    return [attack_of(p) for p in parse_parameter_list(texts)]


def spec_help() -> str:
    """One line per registered attack, ``name: key=default, …`` (for ``--help``)."""
    return "; ".join(
        f"{name}: " + ", ".join(f"{k}={v}" for k, v in parameter_defaults(cls).items())
        for name, cls in ATTACK_PARAMETERS.items()
    )
