"""Every attack's parameters, without torch: the declarations the attack classes are built on.

An attack's parameters are a frozen dataclass deriving from :class:`AttackParameters`: its fields
(with their defaults and types), their range checks (:meth:`AttackParameters.check`), its label
and L∞ radius, and what it is (:attr:`~AttackParameters.name`, :attr:`~AttackParameters.targeted`,
:attr:`~AttackParameters.slow`, :attr:`~AttackParameters.requires`). The attack itself derives
from its parameters class and from :class:`bayesgate.attacks.methods.base.Attack`, adding only the
computation (``perturb``, torch): ``class FGS(FGSParameters, Attack)``. So each parameter is
declared once, here.

Why a module of its own: ``bayesgate attack`` makes a flag of every attack's parameters, and
``calibrate`` lists them in its help (:func:`bayesgate.attacks.specs.spec_help`). Read from here,
the command line's parsers — ``--help``, an unknown flag, a spec whose values do not check
(:func:`bayesgate.attacks.specs.parse_parameters`) — answer without importing torch (~3 s); the
attack classes (:data:`bayesgate.attacks.methods.ATTACKS`) are imported when an attack runs.
:data:`ATTACK_PARAMETERS` is the name → parameters class table in help order; ``ATTACKS`` must
name the same attacks in the same order, each a subclass of its parameters class (checked when
``ATTACKS`` is built).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar

from bayesgate.errors import InvalidArgument

PARSE = "parse"
"""Field-metadata key of a parameter's own parser (``str | value ↦ value``, raising
``ValueError``); without one the default's type (int, float, bool, str) converts the value."""


@dataclasses.dataclass(frozen=True)
class AttackParameters:
    """Base class of the attacks' parameters; the fields of a subclass are its parameters."""

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


P = TypeVar("P", bound=AttackParameters)


def registry(classes: Iterable[type[P]], base: type[P]) -> dict[str, type[P]]:
    """``{cls.name: cls}`` for classes deriving from ``base``, checked: frozen dataclasses, unique
    names, a ``target`` parameter on every targeted attack."""
    table: dict[str, type[P]] = {}
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{cls!r} is not an {base.__name__} subclass")
        own = vars(cls).get("__dataclass_params__")  # set by the decorator on the class itself
        if own is None or not own.frozen:
            raise TypeError(f"{cls.__name__} must be decorated with @dataclass(frozen=True)")
        if cls.name in table:
            raise ValueError(f"attack name {cls.name!r} registered twice")
        if cls.targeted and "target" not in parameter_defaults(cls):
            raise TypeError(f"targeted attack {cls.__name__} needs a 'target' parameter")
        table[cls.name] = cls
    return table


def parameter_defaults(cls: type[AttackParameters]) -> dict[str, Any]:
    """``{parameter: default}`` of an attack (or its parameters) class, in declaration order."""
    return {f.name: f.default for f in dataclasses.fields(cls)}


def check(ok: bool, message: str) -> None:
    """``ValueError(message)`` unless ``ok``: one line per range check in
    :meth:`AttackParameters.check`."""
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


# --- the attacks' parameters (their computations: the module of each attack) ---------------------


@dataclasses.dataclass(frozen=True)
class FGSParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.fgs.FGS`, untargeted Fast Gradient Sign."""

    name: ClassVar[str] = "fgs"
    requires: ClassVar[tuple[str, ...]] = ("cleverhans",)

    eta: float = 0.2
    """Step size η (the L∞ radius of the one step)."""

    def check(self) -> None:
        check(0.0 <= self.eta <= 1.0, f"fgs eta must be in [0, 1], got {self.eta}")

    @property
    def linf_radius(self) -> float:
        return self.eta

    @property
    def label(self) -> str:
        return f"FGS η={self.eta:g}"


RANDOM = "random"


def parse_target(attack: str, value: Any) -> int | str:
    """A target class index, or ``"random"`` (a random class ≠ the label per image)."""
    if value == RANDOM:
        return RANDOM
    try:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(
            f"attack {attack!r}: target must be a class index or 'random', got {value!r}"
        ) from exc


@dataclasses.dataclass(frozen=True)
class TargetedFGSParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.targeted.TargetedFGS`, the paper's targeted
    iterative FGS."""

    name: ClassVar[str] = "targeted"
    requires: ClassVar[tuple[str, ...]] = ("cleverhans",)
    targeted: ClassVar[bool] = True

    eta: float = 0.01
    """Step size η."""
    steps: int = 40
    """Number of steps."""
    target: int | str = dataclasses.field(default=RANDOM, metadata={PARSE: parse_target})
    """Target class, or ``"random"``: a class ≠ the label, drawn per image (seeded)."""

    def check(self) -> None:
        check(0.0 < self.eta <= 1.0, f"targeted eta must be in (0, 1], got {self.eta}")
        check(self.steps >= 0, f"targeted steps must be ≥ 0, got {self.steps}")
        check(self.target == RANDOM or self.target >= 0, "targeted target must be ≥ 0")

    @property
    def linf_radius(self) -> float:
        """``steps·η``: each step moves a pixel by at most η."""
        return self.steps * self.eta

    @property
    def label(self) -> str:
        to = "" if self.target == RANDOM else f" →{self.target}"
        return f"targeted {self.steps}×η={self.eta:g}{to}"


@dataclasses.dataclass(frozen=True)
class PGDParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.pgd.PGD`, untargeted L∞ PGD with a random start."""

    name: ClassVar[str] = "pgd"
    requires: ClassVar[tuple[str, ...]] = ("cleverhans",)

    eps: float = 0.3
    """L∞ radius ε."""
    eps_iter: float = 0.01
    """Step size."""
    steps: int = 40
    """Number of steps after the random start."""

    def check(self) -> None:
        check(0.0 < self.eps <= 1.0, f"pgd eps must be in (0, 1], got {self.eps}")
        check(
            0.0 < self.eps_iter <= self.eps,
            f"pgd needs 0 < eps_iter ≤ eps, got eps_iter={self.eps_iter}, eps={self.eps}",
        )
        check(self.steps >= 1, f"pgd steps must be ≥ 1, got {self.steps}")

    @property
    def linf_radius(self) -> float:
        return self.eps

    @property
    def label(self) -> str:
        return f"PGD ε={self.eps:g}"


@dataclasses.dataclass(frozen=True)
class CWL2Parameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.cw.CWL2`, untargeted Carlini–Wagner L2."""

    name: ClassVar[str] = "cw"
    requires: ClassVar[tuple[str, ...]] = ("cleverhans",)
    slow: ClassVar[bool] = True

    iterations: int = 100
    """Adam iterations per binary-search step."""
    binary_steps: int = 3
    """Binary-search steps on the constant c."""
    lr: float = 0.1
    """Adam learning rate."""
    const: float = 10.0
    """Initial constant c."""
    confidence: float = 1.0
    """Margin κ in nats of ``log p̄``."""

    def check(self) -> None:
        check(self.iterations >= 1, f"cw iterations must be ≥ 1, got {self.iterations}")
        check(self.binary_steps >= 1, f"cw binary_steps must be ≥ 1, got {self.binary_steps}")
        check(self.lr > 0 and self.const > 0, "cw lr and const must be > 0")
        check(self.confidence >= 0, f"cw confidence must be ≥ 0, got {self.confidence}")

    @property
    def label(self) -> str:
        return f"CW-L2 κ={self.confidence:g}"


APGD_LOSSES = ("ce", "dlr")
"""The losses APGD ascends, by name: :data:`bayesgate.attacks.losses.LOSSES` (torch) implements
them, checked when that module is imported."""


@dataclasses.dataclass(frozen=True)
class APGDParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.apgd.APGD`, Auto-PGD with the CE or DLR loss."""

    name: ClassVar[str] = "apgd"

    eps: float = 0.3
    """L∞ radius ε."""
    steps: int = 100
    """Gradient queries N (the checkpoints are fractions of it)."""
    loss: str = "ce"
    """``ce`` (cross-entropy) or ``dlr`` (difference of logits ratio)."""

    def check(self) -> None:
        check(0.0 < self.eps <= 1.0, f"apgd eps must be in (0, 1], got {self.eps}")
        check(self.steps >= 1, f"apgd steps must be ≥ 1, got {self.steps}")
        check(
            self.loss in APGD_LOSSES,
            f"apgd loss must be one of {', '.join(APGD_LOSSES)}, got {self.loss!r}",
        )

    @property
    def linf_radius(self) -> float:
        return self.eps

    @property
    def label(self) -> str:
        return f"APGD-{self.loss.upper()}-{self.steps} ε={self.eps:g}"


@dataclasses.dataclass(frozen=True)
class PGDRestartsParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.pgd_restarts.PGDRestarts`, L∞ PGD with random
    restarts."""

    name: ClassVar[str] = "pgd-restarts"

    eps: float = 0.3
    """L∞ radius ε."""
    eps_iter: float = 0.01
    """Step size (ε/30 at the default ε)."""
    steps: int = 100
    """Steps per restart."""
    restarts: int = 5
    """Random restarts."""

    def check(self) -> None:
        check(0.0 < self.eps <= 1.0, f"pgd-restarts eps must be in (0, 1], got {self.eps}")
        check(self.eps_iter > 0, f"pgd-restarts eps_iter must be > 0, got {self.eps_iter}")
        check(self.steps >= 1, f"pgd-restarts steps must be ≥ 1, got {self.steps}")
        check(self.restarts >= 1, f"pgd-restarts restarts must be ≥ 1, got {self.restarts}")

    @property
    def linf_radius(self) -> float:
        return self.eps

    @property
    def label(self) -> str:
        return f"PGD-{self.steps} × {self.restarts} ε={self.eps:g}"


@dataclasses.dataclass(frozen=True)
class SquareParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.square.Square`, the black-box L∞ Square Attack."""

    name: ClassVar[str] = "square"
    slow: ClassVar[bool] = True

    eps: float = 0.3
    """L∞ radius ε."""
    queries: int = 1000
    """Query budget per image (the initialisation included)."""
    p_init: float = 0.3
    """Initial fraction of pixels a square covers (the paper's MNIST value)."""
    confidence: float = 1.0
    """Stop attacking an image once its best margin is below −confidence."""

    def check(self) -> None:
        check(0.0 < self.eps <= 1.0, f"square eps must be in (0, 1], got {self.eps}")
        check(self.queries >= 1, f"square queries must be ≥ 1, got {self.queries}")
        check(0.0 < self.p_init <= 1.0, f"square p_init must be in (0, 1], got {self.p_init}")
        check(self.confidence >= 0, f"square confidence must be ≥ 0, got {self.confidence}")

    @property
    def linf_radius(self) -> float:
        return self.eps

    @property
    def label(self) -> str:
        return f"Square ε={self.eps:g}, {self.queries} queries"


@dataclasses.dataclass(frozen=True)
class SLIDEParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.slide.SLIDE`, untargeted sparse L1 descent
    (Tramèr & Boneh 2019)."""

    name: ClassVar[str] = "slide"
    requires: ClassVar[tuple[str, ...]] = ("cleverhans",)

    eps: float = 10.0
    """L1 radius ε₁ (Tramèr & Boneh's MNIST threat model: 10)."""
    eps_iter: float = 1.0
    """L1 length of each step."""
    steps: int = 100
    """Gradient steps."""
    sparsity: float = 99.0
    """Percentile of ``|∇|`` above which a pixel is updated in a step (99: the top 1 %)."""

    def check(self) -> None:
        check(self.eps > 0, f"slide eps must be > 0, got {self.eps}")
        check(
            0 < self.eps_iter <= self.eps,
            f"slide eps_iter must be in (0, eps = {self.eps:g}], got {self.eps_iter}",
        )
        check(self.steps >= 1, f"slide steps must be ≥ 1, got {self.steps}")
        check(0 < self.sparsity < 100, f"slide sparsity must be in (0, 100), got {self.sparsity}")

    @property
    def label(self) -> str:
        return f"SLIDE L1 ε={self.eps:g}"


SPARSE_REGIONS = ("anywhere", "strokes")
"""Where a Sparse-RS search may place its pixels: every position, or the digit's strokes and
their one-pixel border (:func:`bayesgate.attacks.methods.sparse_rs.near_strokes`)."""


@dataclasses.dataclass(frozen=True)
class SparseRSParameters(AttackParameters):
    """Of :class:`~bayesgate.attacks.methods.sparse_rs.SparseRS`, the black-box L0 Sparse-RS
    attack (Croce et al. 2022) on at most ``pixels`` pixels.

    No :attr:`linf_radius`: a perturbed pixel goes to 0 or 1, so the only L∞ bound is the box's.
    """

    name: ClassVar[str] = "sparse-rs"
    slow: ClassVar[bool] = True

    pixels: int = 10
    """The paper's ``k``: pixels perturbed (the L0 budget), each set to 0 or 1, so
    ``‖δ‖₁ ≤ pixels`` on grayscale images (10: SLIDE's ε₁). Not ``k``: ``bayesgate attack`` makes
    a flag of every parameter, and its ``--k`` is the number of MC passes."""
    queries: int = 1000
    """Query budget per image (the initialisation included)."""
    alpha_init: float = 0.3
    """Initial fraction of the ``k`` pixels resampled per iteration (the authors' untargeted L0
    value; no MNIST value was found)."""
    confidence: float = 1.0
    """Stop attacking an image once its best margin is below −confidence."""

    def check(self) -> None:
        check(self.pixels >= 1, f"sparse-rs pixels must be ≥ 1, got {self.pixels}")
        check(self.queries >= 1, f"sparse-rs queries must be ≥ 1, got {self.queries}")
        check(
            0.0 < self.alpha_init <= 1.0,
            f"sparse-rs alpha_init must be in (0, 1], got {self.alpha_init}",
        )
        check(self.confidence >= 0, f"sparse-rs confidence must be ≥ 0, got {self.confidence}")

    @property
    def label(self) -> str:
        return f"Sparse-RS L0 k={self.pixels}, {self.queries} queries"


ATTACK_PARAMETERS: dict[str, type[AttackParameters]] = registry(
    (
        FGSParameters,
        TargetedFGSParameters,
        PGDParameters,
        CWL2Parameters,
        APGDParameters,
        PGDRestartsParameters,
        SquareParameters,
        SLIDEParameters,
        SparseRSParameters,
    ),
    AttackParameters,
)
"""Spec name → parameters class, in the order help texts list them."""
