"""What every attack shares: its parameters as a frozen dataclass, one ``__call__``, the registry.

An attack is a frozen dataclass whose fields are its parameters (with their defaults) and whose
class variables say what it is (:attr:`Attack.name`, :attr:`Attack.targeted`, :attr:`Attack.slow`).
Calling it attacks one batch::

    x_adv = attack(model_fn, x, y, generator=g)        # B×…, in [0, 1]

with ``model_fn`` the attacked function ``x ↦ log p̄(·|x)`` (B×C; see
:mod:`bayesgate.attacks.model_fn`), ``x`` images in [0, 1], ``y`` the labels an untargeted attack
pushes away from (default: the model's own prediction) or the classes a targeted attack pushes
towards, and ``generator`` the attack's own randomness (random starts, random search; the dropout
masks belong to ``model_fn``). A subclass implements :meth:`Attack.perturb` on an
:class:`AttackInput`, :meth:`Attack.check` and :attr:`Attack.label` (and
:attr:`Attack.linf_radius` when it stays in an L∞ ball); its parameters are coerced to their
declared types and checked when it is built, so ``FGS(eta="0.2") == FGS(eta=0.2)`` and a bad
value fails early.

:func:`attack_registry` builds the name → class table that the spec parser, ``run_attack`` and
the CLI read (:data:`bayesgate.attacks.methods.ATTACKS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from bayesgate.attacks.model_fn import ModelFn
from bayesgate.errors import InvalidArgument

StepCallback = Callable[[int, torch.Tensor], None]
"""Called as ``callback(t, x_t)`` after step ``t`` (and with ``t = 0`` for the start point)."""

CLIP_MIN, CLIP_MAX = 0.0, 1.0

PARSE = "parse"
"""Field-metadata key of a parameter's own parser (``str | value ↦ value``, raising
``ValueError``); without one the default's type (int, float, bool, str) converts the value."""


@dataclasses.dataclass(frozen=True)
class AttackInput:
    """One batch as :meth:`Attack.perturb` sees it, checked (see :meth:`Attack.__call__`)."""

    model_fn: ModelFn
    """The attacked function ``x ↦ log p̄(·|x)`` (B×C)."""
    x: torch.Tensor
    """Images (B×…) in [0, 1]."""
    y: torch.Tensor
    """Labels to move away from (untargeted) or target classes (targeted), int64 B."""
    generator: torch.Generator | None = None
    """The attack's own randomness."""
    on_step: StepCallback | None = None
    """``on_step(t, x_t)`` for attacks that step one at a time."""


@dataclasses.dataclass(frozen=True)
class Attack:
    """Base class of the attacks; the fields of a subclass are its parameters."""

    name: ClassVar[str]
    """Spec name, ``NAME`` in ``NAME:key=value,…``."""
    targeted: ClassVar[bool] = False
    """``True``: ``y`` holds target classes and the class has a ``target`` parameter
    (a class index or ``"random"``, see :func:`bayesgate.attacks.run.choose_targets`)."""
    slow: ClassVar[bool] = False
    """``True`` for attacks that the detection sweep runs on a subset only (``--cw-limit``)."""
    requires: ClassVar[tuple[str, ...]] = ()
    """Optional modules the attack imports when it runs (``("cleverhans",)``: the ``[attacks]``
    extra); the commands check them before any work (:mod:`bayesgate.extras`)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _coerce(self.name, f, getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the parameter when a value is out of range."""

    @property
    def label(self) -> str:
        """Short human label for tables and plots, e.g. ``FGS η=0.2``."""
        raise NotImplementedError

    @property
    def linf_radius(self) -> float | None:
        """Radius of the L∞ ball around ``x`` that the adversarial images stay in (``None``: the
        attack bounds no L∞ distance, e.g. CW-L2)."""
        return None

    @property
    def params(self) -> dict[str, Any]:
        """Every parameter, in declaration order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def key(self) -> str:
        """Canonical spec string ``NAME:key=value,…`` (every parameter); it parses back to
        an equal attack."""
        return f"{self.name}:" + ",".join(f"{k}={v}" for k, v in self.params.items())

    def __call__(
        self,
        model_fn: ModelFn,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        on_step: StepCallback | None = None,
    ) -> torch.Tensor:
        """Adversarial images for the batch ``x`` (B×…, in [0, 1]), same shape, in [0, 1].

        ``y`` (int64, B): target classes of a targeted attack (required); for an untargeted one
        the labels to move away from, by default ``argmax_c model_fn(x)`` (the model's own
        prediction, which avoids label leaking; one call of ``model_fn``). ``on_step`` sees the
        iterates of attacks that step one at a time.
        """
        check_images(x)
        if y is not None:
            y = check_labels(y, x, "target labels" if self.targeted else "labels y")
        elif self.targeted:
            raise ValueError(f"{self.name} is targeted: give the target labels y")
        else:
            y = own_prediction(model_fn, x)
        return self.perturb(AttackInput(model_fn, x, y, generator, on_step)).detach()

    def perturb(self, batch: AttackInput) -> torch.Tensor:
        """The attack proper, on checked inputs (see :meth:`__call__`)."""
        raise NotImplementedError


def attack_registry(*classes: type[Attack]) -> dict[str, type[Attack]]:
    """``{cls.name: cls}`` for attack classes, checked: frozen dataclasses deriving from
    :class:`Attack`, unique names, a ``target`` parameter on every targeted attack."""
    registry: dict[str, type[Attack]] = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Attack)):
            raise TypeError(f"{cls!r} is not an Attack subclass")
        own = vars(cls).get("__dataclass_params__")  # set by the decorator on the class itself
        if own is None or not own.frozen:
            raise TypeError(f"{cls.__name__} must be decorated with @dataclass(frozen=True)")
        if cls.name in registry:
            raise ValueError(f"attack name {cls.name!r} registered twice")
        if cls.targeted and "target" not in parameter_defaults(cls):
            raise TypeError(f"targeted attack {cls.__name__} needs a 'target' parameter")
        registry[cls.name] = cls
    return registry


def parameter_defaults(cls: type[Attack]) -> dict[str, Any]:
    """``{parameter: default}`` of an attack class, in declaration order."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def check(ok: bool, message: str) -> None:
    """``ValueError(message)`` unless ``ok``: one line per range check in :meth:`Attack.check`."""
    if not ok:
        raise InvalidArgument(message)


def _coerce(attack: str, f: dataclasses.Field, value: Any) -> Any:
    parse = f.metadata.get(PARSE)
    if parse is not None:
        return parse(attack, value)
    kind = type(f.default)
    try:
        if kind is bool:
            return _boolean(value)
        if kind is int:
            as_float = float(value)
            if isinstance(value, bool) or as_float != int(as_float):
                raise ValueError
            return int(as_float)
        return kind(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(
            f"attack {attack!r}: {f.name} must be {kind.__name__}, got {value!r}"
        ) from exc


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "1", "yes"}:
        return True
    if text in {"false", "0", "no"}:
        return False
    raise ValueError


def check_images(x: torch.Tensor) -> None:
    """Images must be a non-empty floating-point tensor with values in [0, 1]."""
    if not torch.is_tensor(x) or not x.is_floating_point():
        raise ValueError("images must be a floating-point tensor")
    if x.numel() == 0:
        raise ValueError("no images to attack")
    if x.min() < CLIP_MIN or x.max() > CLIP_MAX:
        raise ValueError(
            f"images must lie in [0, 1]; got values in [{float(x.min()):.3g}, {float(x.max()):.3g}]"
        )


def check_labels(y: torch.Tensor, x: torch.Tensor, name: str) -> torch.Tensor:
    """``y`` as an int64 tensor of shape (B,) on ``x``'s device."""
    y = torch.as_tensor(y, device=x.device)
    if y.dtype != torch.int64 or y.shape != (x.shape[0],):
        raise ValueError(f"{name} must be int64 of shape ({x.shape[0]},), got {y.dtype} {y.shape}")
    return y


def own_prediction(model_fn: ModelFn, x: torch.Tensor) -> torch.Tensor:
    """``argmax_c model_fn(x)_c`` (B), without a graph."""
    with torch.no_grad():
        return model_fn(x).argmax(dim=1)
