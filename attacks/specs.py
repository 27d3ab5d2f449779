"""Attack specifications: a name plus parameters, parsed from strings like ``fgs:eta=0.2``.

Syntax ``NAME[:key=value[,key=value…]]``; unspecified parameters take the defaults in
:data:`ATTACK_PARAMS`. Examples: ``fgs:eta=0.3``, ``targeted:steps=40,eta=0.01,target=0``,
``pgd:eps=0.3``, ``cw:iterations=100``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# name -> {parameter: default}; the default's type is the parameter's type.
ATTACK_PARAMS: dict[str, dict[str, Any]] = {
    "fgs": {"eta": 0.2},
    "targeted": {"eta": 0.01, "steps": 40, "target": "random"},
    "pgd": {"eps": 0.3, "eps_iter": 0.01, "steps": 40},
    "cw": {"iterations": 100, "binary_steps": 3, "lr": 0.1, "const": 10.0, "confidence": 1.0},
}
TARGETED = frozenset({"targeted"})

DEFAULT_ATTACKS = ("fgs:eta=0.1", "fgs:eta=0.2", "fgs:eta=0.3", "targeted:steps=40,eta=0.01")
"""What ``bayesgate calibrate`` evaluates unless told otherwise (PGD and CW are opt-in)."""

_SYMBOLS = {"eta": "η", "eps": "ε"}


@dataclass(frozen=True)
class AttackSpec:
    """One attack configuration; ``params`` holds every parameter (defaults filled in)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in ATTACK_PARAMS:
            raise ValueError(
                f"unknown attack {self.name!r}; choose one of {', '.join(ATTACK_PARAMS)}"
            )
        defaults = ATTACK_PARAMS[self.name]
        unknown = set(self.params) - set(defaults)
        if unknown:
            raise ValueError(
                f"attack {self.name!r} has no parameter(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(defaults)}"
            )
        full = {
            key: _coerce(self.name, key, self.params.get(key, d), d) for key, d in defaults.items()
        }
        object.__setattr__(self, "params", full)
        _validate(self.name, full)

    @classmethod
    def parse(cls, text: str) -> AttackSpec:
        """Parse ``NAME[:key=value,…]`` (see the module docstring)."""
        name, _, rest = text.strip().partition(":")
        params: dict[str, Any] = {}
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"attack {text!r}: expected key=value, got {item!r}")
            params[key.strip()] = value.strip()
        return cls(name.strip(), params)

    @property
    def targeted(self) -> bool:
        return self.name in TARGETED

    @property
    def key(self) -> str:
        """Canonical string form, ``parse(key) == self``."""
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in self.params.items())

    @property
    def label(self) -> str:
        """Short human label, e.g. ``FGS η=0.2``, ``targeted 40×η=0.01``, ``PGD ε=0.3``."""
        p = self.params
        if self.name == "fgs":
            return f"FGS η={p['eta']:g}"
        if self.name == "targeted":
            to = "" if p["target"] == "random" else f" →{p['target']}"
            return f"targeted {p['steps']}×η={p['eta']:g}{to}"
        if self.name == "pgd":
            return f"PGD ε={p['eps']:g}"
        return f"CW-L2 κ={p['confidence']:g}"


def _coerce(attack: str, key: str, value: Any, default: Any) -> Any:
    if key == "target":
        return _target(attack, value)
    kind = type(default)
    try:
        if kind is int:
            as_float = float(value)
            if as_float != int(as_float):
                raise ValueError
            return int(as_float)
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"attack {attack!r}: {key} must be {kind.__name__}, got {value!r}"
        ) from exc


def _target(attack: str, value: Any) -> int | str:
    if value == "random":
        return "random"
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"attack {attack!r}: target must be a class index or 'random', got {value!r}"
        ) from exc


def _validate(name: str, p: dict[str, Any]) -> None:
    checks: list[tuple[bool, str]] = []
    if name == "fgs":
        checks.append((0.0 <= p["eta"] <= 1.0, f"fgs eta must be in [0, 1], got {p['eta']}"))
    elif name == "targeted":
        checks += [
            (0.0 < p["eta"] <= 1.0, f"targeted eta must be in (0, 1], got {p['eta']}"),
            (p["steps"] >= 0, f"targeted steps must be ≥ 0, got {p['steps']}"),
            (p["target"] == "random" or p["target"] >= 0, "targeted target must be ≥ 0"),
        ]
    elif name == "pgd":
        checks += [
            (0.0 < p["eps"] <= 1.0, f"pgd eps must be in (0, 1], got {p['eps']}"),
            (
                0.0 < p["eps_iter"] <= p["eps"],
                f"pgd needs 0 < eps_iter ≤ eps, got {p['eps_iter']}",
            ),
            (p["steps"] >= 1, f"pgd steps must be ≥ 1, got {p['steps']}"),
        ]
    else:
        checks += [
            (p["iterations"] >= 1, f"cw iterations must be ≥ 1, got {p['iterations']}"),
            (p["binary_steps"] >= 1, f"cw binary_steps must be ≥ 1, got {p['binary_steps']}"),
            (p["lr"] > 0 and p["const"] > 0, "cw lr and const must be > 0"),
            (p["confidence"] >= 0, f"cw confidence must be ≥ 0, got {p['confidence']}"),
        ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)


def parse_attacks(texts: list[str] | tuple[str, ...]) -> list[AttackSpec]:
    """Parse several specs; duplicates are an error (they would collide in the results)."""
    specs = [AttackSpec.parse(t) for t in texts]
    keys = [s.key for s in specs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"attack(s) listed twice: {', '.join(dupes)}")
    if not specs:
        raise ValueError("no attacks given")
    return specs
