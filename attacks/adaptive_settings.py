"""The adaptive attack's parameters and what ``bayesgate adaptive-eval`` runs, without torch.

- :func:`check_radius`, :func:`check_non_negative` — the range checks of radii, weights and
  margins, naming the flag or parameter;
- :class:`AdaptivePGDParameters`, :class:`AdaptiveAPGDParameters`, … — the declarations the
  attacks (:class:`bayesgate.attacks.adaptive.AdaptivePGD`,
  :class:`bayesgate.attacks.adaptive_apgd.AdaptiveAPGD`, …, torch) are built on: fields, defaults,
  checks and step sizes; the attacks add only the computation;
- :class:`AdaptiveSettings` — radii, detector weights, steps, subset and K of ``adaptive-eval``
  (:mod:`bayesgate.attacks.adaptive_eval`, torch), checked when made.

Why a module of its own: ``adaptive-eval`` shows these defaults in its ``--help`` and checks its
flags and settings (every attack's parameters included) before the model is loaded; read from
here, they answer without importing torch (~3 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from bayesgate.attacks.methods.parameters import SPARSE_REGIONS
from bayesgate.errors import InvalidArgument

if TYPE_CHECKING:
    from bayesgate.attacks.adaptive import AdaptivePGD

SCHEDULES = ("misclassify-first", "joint")
"""When the detector term of the loss counts (:mod:`bayesgate.attacks.adaptive`)."""
OPTIMIZERS = ("pgd", "apgd", "slide", "sparse-rs", "patch-rs")
"""What minimises the adaptive attack's loss: fixed ε/25 L∞ steps, Auto-PGD's schedule, sparse
L1 steps (SLIDE; ε is then an L1 radius), Sparse-RS's random search over which pixels to set
to 0 or 1 (no gradient; ε is then the number of pixels, an L0 budget), or Sparse-RS's patch
search over the location and the 0/1 content of one square patch (no gradient; ε is then the
pixel budget k, the patch ⌊√k⌋×⌊√k⌋)."""

RANDOM_SEARCH_LABELS = {"sparse-rs": "Sparse-RS", "patch-rs": "Patch-RS"}
"""The optimizers that only query (no gradient), budgeted in queries and in pixels (L0), and
their names in messages and row labels."""
RANDOM_SEARCHES = tuple(RANDOM_SEARCH_LABELS)


def default_steps(optimizer: str) -> int:
    """Steps per attack when none are given: 100 gradient steps, or 1000 queries per image for
    ``sparse-rs`` and ``patch-rs`` (the detector-blind ``sparse-rs`` attack's default budget: a
    random search needs many more queries than a gradient method needs steps)."""
    return 1000 if optimizer in RANDOM_SEARCHES else 100


def check_radius(name: str, value: float) -> None:
    """:class:`InvalidArgument` naming ``name`` (a flag or parameter) unless ``value`` is an L∞
    radius in (0, 1] (NaN and ∞ are not)."""
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise InvalidArgument(f"{name} must be in (0, 1], got {value}")


def check_non_negative(name: str, value: float) -> None:
    """:class:`InvalidArgument` naming ``name`` unless ``value`` is finite and ≥ 0 (a weight λ or
    a margin κ, δ: NaN would also end up as invalid JSON in the results)."""
    if not (math.isfinite(value) and value >= 0.0):
        raise InvalidArgument(f"{name} must be a finite number ≥ 0, got {value}")


@dataclass(frozen=True)
class AdaptivePGDParameters:
    """Of :class:`~bayesgate.attacks.adaptive.AdaptivePGD`: radius ``eps``, ``steps`` steps of
    ``step_size`` (default ``eps/25``), detector weight ``weight`` (λ), margins ``kappa`` (κ) and
    ``delta`` (δ), and the ``schedule`` of the detector term."""

    eps: float = 0.3
    steps: int = 100
    step_size: float | None = None
    weight: float = 1.0
    kappa: float = 1.0
    delta: float = 0.5
    schedule: str = "misclassify-first"

    optimizer: ClassVar[str] = "pgd"  # what minimises the loss (reports, cache names)

    def __post_init__(self) -> None:
        self.check_eps("adaptive eps", self.eps)
        if self.steps < 1:
            raise InvalidArgument(f"adaptive steps must be ≥ 1, got {self.steps}")
        if self.step_size is not None and not 0.0 < self.step_size <= self.eps:
            raise InvalidArgument(f"adaptive step_size must be in (0, eps], got {self.step_size}")
        check_non_negative("adaptive weight", self.weight)
        check_non_negative("adaptive kappa", self.kappa)
        check_non_negative("adaptive delta", self.delta)
        if self.schedule not in SCHEDULES:
            raise InvalidArgument(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )

    @staticmethod
    def check_eps(name: str, value: float) -> None:
        """The radius's range check (an L∞ radius here: :func:`check_radius`)."""
        check_radius(name, value)

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else self.eps / 25

    @property
    def starts(self) -> int:
        """Random starts per example (one; the APGD variant restarts)."""
        return 1

    @property
    def cache_tag(self) -> str:
        """What sets this attack apart in an image-cache name beyond the shared fields."""
        return ""


@dataclass(frozen=True)
class AdaptiveAPGDParameters(AdaptivePGDParameters):
    """Of :class:`~bayesgate.attacks.adaptive_apgd.AdaptiveAPGD`: :class:`AdaptivePGDParameters`
    (``steps`` gradient queries per run) optimised by APGD, with ``restarts`` runs from
    independent random starts."""

    restarts: int = 1

    optimizer: ClassVar[str] = "apgd"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.step_size is not None:
            raise InvalidArgument("APGD sets its own step sizes (2ε, halved at its checkpoints)")
        if self.restarts < 1:
            raise InvalidArgument(f"adaptive restarts must be ≥ 1, got {self.restarts}")

    @property
    def alpha(self) -> float:
        """The first step, 2ε (APGD halves it where the loss stalls)."""
        return 2.0 * self.eps

    @property
    def starts(self) -> int:
        return self.restarts

    @property
    def cache_tag(self) -> str:
        return f"-apgd-r{self.restarts}"


def check_l1_radius(name: str, value: float) -> None:
    """:class:`InvalidArgument` naming ``name`` unless ``value`` is a finite L1 radius > 0."""
    if not (math.isfinite(value) and value > 0.0):
        raise InvalidArgument(f"{name} must be a finite L1 radius > 0, got {value}")


@dataclass(frozen=True)
class AdaptiveSLIDEParameters(AdaptivePGDParameters):
    """Of :class:`~bayesgate.attacks.adaptive_slide.AdaptiveSLIDE`: :class:`AdaptivePGDParameters`
    with ``eps`` an **L1** radius (Tramèr & Boneh's MNIST budget: 10), minimised by sparse L1
    steps of L1 length ``step_size`` (default ε/10) on the pixels whose gradient is at or above
    the ``sparsity``-th percentile, from the clean image (no random start)."""

    eps: float = 10.0
    sparsity: float = 99.0

    optimizer: ClassVar[str] = "slide"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 < self.sparsity < 100.0:
            raise InvalidArgument(f"adaptive sparsity must be in (0, 100), got {self.sparsity}")

    @staticmethod
    def check_eps(name: str, value: float) -> None:
        check_l1_radius(name, value)

    @property
    def alpha(self) -> float:
        return self.step_size if self.step_size is not None else self.eps / 10

    @property
    def cache_tag(self) -> str:
        return f"-slide-q{self.sparsity:g}"


def check_pixel_count(name: str, value: float) -> None:
    """:class:`InvalidArgument` naming ``name`` unless ``value`` is a whole number of pixels ≥ 1
    (an L0 budget; whether it is below the image's pixel count is checked on the images)."""
    if not (math.isfinite(value) and value >= 1.0 and value == int(value)):
        raise InvalidArgument(f"{name} must be a whole number of pixels ≥ 1, got {value:g}")


@dataclass(frozen=True)
class AdaptiveRandomSearchParameters(AdaptivePGDParameters):
    """What the two query-only searches share: :class:`AdaptivePGDParameters` with ``eps`` the L0
    budget ``k`` in pixels (each changed pixel goes to 0 or 1), ``steps`` the queries per image
    (the start included), and ``alpha_init``, the initial size of a move as a fraction (of the
    ``k`` pixels, or of the patch's area). No step size: the moves have none."""

    eps: float = 10.0
    steps: int = 1000
    alpha_init: float = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.step_size is not None:
            raise InvalidArgument(f"{self.label} has no step size (it moves whole pixels)")
        if not (math.isfinite(self.alpha_init) and 0.0 < self.alpha_init <= 1.0):
            raise InvalidArgument(f"adaptive alpha_init must be in (0, 1], got {self.alpha_init}")

    @staticmethod
    def check_eps(name: str, value: float) -> None:
        check_pixel_count(name, value)

    @property
    def label(self) -> str:
        """The search's name in messages."""
        return RANDOM_SEARCH_LABELS[self.optimizer]

    @property
    def pixels(self) -> int:
        """``k``: ``eps`` as the whole number of pixels it is."""
        return int(self.eps)

    @property
    def alpha(self) -> float:
        """The initial move fraction (there is no step): ``alpha_init``."""
        return self.alpha_init


@dataclass(frozen=True)
class AdaptiveSparseRSParameters(AdaptiveRandomSearchParameters):
    """Of :class:`~bayesgate.attacks.adaptive_sparse_rs.AdaptiveSparseRS`:
    :class:`AdaptiveRandomSearchParameters` searched by Sparse-RS's random moves (Croce et al.
    2022) that resample ``max(1, round(α_i·k))`` of the ``k`` pixels, ``α_i`` from ``alpha_init``
    by Square's halving schedule, placing pixels anywhere or, with ``region="strokes"``, only on
    the digit's strokes and their one-pixel border (where a changed pixel has stroke neighbours:
    the clumps a 3×3 median filter keeps)."""

    region: str = "anywhere"

    optimizer: ClassVar[str] = "sparse-rs"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.region not in SPARSE_REGIONS:
            raise InvalidArgument(
                f"sparse-rs region must be one of {', '.join(SPARSE_REGIONS)}, got {self.region!r}"
            )

    @property
    def cache_tag(self) -> str:
        return "-sparse-rs" if self.region == "anywhere" else f"-sparse-rs-{self.region}"


@dataclass(frozen=True)
class AdaptivePatchRSParameters(AdaptiveRandomSearchParameters):
    """Of :class:`~bayesgate.attacks.adaptive_patch_rs.AdaptivePatchRS`:
    :class:`AdaptiveRandomSearchParameters` spent on one square patch of side ``s = ⌊√k⌋``
    (:attr:`side`: ``s² ≤ k`` pixels change, k = 10 gives 3×3; the authors round up, we keep the
    bound), each pixel of it 0 or 1 per channel, searched by Sparse-RS's patch moves (Croce et
    al. 2022): location moves, and content moves on a sub-square of side ``max(⌊√α_i·s⌋, 1)``,
    ``α_i`` from ``alpha_init`` (0.4: the authors' untargeted patch value) by their patch
    schedule."""

    eps: float = 9.0
    alpha_init: float = 0.4

    optimizer: ClassVar[str] = "patch-rs"

    @property
    def side(self) -> int:
        """``s = ⌊√k⌋``: the patch's side, so that it changes at most ``s² ≤ k`` pixels."""
        return math.isqrt(self.pixels)

    @property
    def cache_tag(self) -> str:
        return "-patch-rs"


def radius_check(optimizer: str) -> Callable[[str, float], None]:
    """The range check of ``--eps`` for ``optimizer``: L1 radii for ``slide``, pixel counts for
    ``sparse-rs`` and ``patch-rs``, L∞ radii otherwise."""
    checks = {"slide": check_l1_radius} | dict.fromkeys(RANDOM_SEARCHES, check_pixel_count)
    return checks.get(optimizer, check_radius)


@dataclass(frozen=True)
class AdaptiveSettings:
    """Radii, detector weights (λ = 0 is plain PGD and always run), steps, test subset, K of the
    attack (``None``: card ``k_attack``) and of the fresh evaluation (``None``: detector's K)."""

    eps: tuple[float, ...] = (0.1, 0.2, 0.3)
    weights: tuple[float, ...] = (0.1, 1.0, 10.0)
    joint_weights: tuple[float, ...] = ()
    steps: int | None = None  # None: 100 steps, or 1000 queries with sparse-rs, patch-rs
    kappa: float = 1.0
    delta: float = 0.5
    limit: int = 500
    k_attack: int | None = None
    k: int | None = None
    seed: int = 0
    batch_size: int = 100
    cache_dir: Path | None = None
    optimizer: str = "pgd"  # one of OPTIMIZERS
    restarts: int = 1  # APGD only: runs from new random starts on the examples not yet found
    region: str = "anywhere"  # sparse-rs only: where pixels go (SPARSE_REGIONS)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise InvalidArgument(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        if self.steps is None:
            object.__setattr__(self, "steps", default_steps(self.optimizer))
        if self.restarts < 1 or (self.restarts > 1 and self.optimizer != "apgd"):
            raise InvalidArgument(
                f"restarts {self.restarts}: must be ≥ 1, and more than 1 needs the apgd optimizer"
            )
        if self.region != "anywhere" and self.optimizer != "sparse-rs":
            raise InvalidArgument(f"region {self.region!r} needs the sparse-rs optimizer")
        if not self.eps:
            raise InvalidArgument("give at least one eps")
        for eps in self.eps:  # every attack checks its parameters now, not midway through a run
            self.parameters(eps)

    def parameters(self, eps: float) -> list[tuple[str, AdaptivePGDParameters]]:
        """``(name, parameters)`` of the attacks at radius ``eps``: plain PGD, the adaptive attack
        per weight, the joint schedule (with ``optimizer="apgd"``: the same configurations
        optimised by APGD, named so); checked, without torch."""
        common: dict[str, Any] = {
            "eps": eps, "steps": self.steps, "kappa": self.kappa, "delta": self.delta,
        }  # fmt: skip
        kind: type[AdaptivePGDParameters] = AdaptivePGDParameters
        prefix = ""
        if self.optimizer == "apgd":
            kind, prefix, common["restarts"] = AdaptiveAPGDParameters, "APGD ", self.restarts
        elif self.optimizer == "slide":
            kind, prefix = AdaptiveSLIDEParameters, "SLIDE "
        elif self.optimizer == "sparse-rs":
            kind, prefix = AdaptiveSparseRSParameters, "Sparse-RS "
            common["region"] = self.region
            if self.region != "anywhere":
                prefix = f"Sparse-RS ({self.region}) "
        elif self.optimizer == "patch-rs":
            kind, prefix = AdaptivePatchRSParameters, "Patch-RS "
        out = [(f"plain {prefix or 'PGD'}".rstrip(), kind(weight=0.0, **common))]
        out += [(f"adaptive {prefix}λ={w:g}", kind(weight=w, **common)) for w in self.weights]
        out += [
            (f"joint {prefix}λ={w:g}", kind(weight=w, schedule="joint", **common))
            for w in self.joint_weights
        ]
        return out

    def configs(self, eps: float) -> list[tuple[str, AdaptivePGD]]:
        """``(name, attack)`` of :meth:`parameters`: the attacks themselves (torch)."""
        from bayesgate.attacks.adaptive import AdaptivePGD
        from bayesgate.attacks.adaptive_apgd import AdaptiveAPGD
        from bayesgate.attacks.adaptive_patch_rs import AdaptivePatchRS
        from bayesgate.attacks.adaptive_slide import AdaptiveSLIDE
        from bayesgate.attacks.adaptive_sparse_rs import AdaptiveSparseRS

        kinds = {
            "pgd": AdaptivePGD, "apgd": AdaptiveAPGD, "slide": AdaptiveSLIDE,
            "sparse-rs": AdaptiveSparseRS, "patch-rs": AdaptivePatchRS,
        }  # fmt: skip
        return [(name, kinds[self.optimizer](**asdict(p))) for name, p in self.parameters(eps)]
