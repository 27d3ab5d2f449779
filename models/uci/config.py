"""The settings of the UCI regression protocol (:class:`UCIConfig`) and their checks, without torch.

Why a module of its own: ``bayesgate uci`` checks its settings by building a :class:`UCIConfig`
before any data is read or network trained. Read from here, a setting it refuses answers without
importing torch (~3 s); the experiment (:mod:`.experiment`, torch) imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from bayesgate.errors import InvalidArgument

if TYPE_CHECKING:
    from bayesgate.models.uci.data import UCIDataset

PAPER_ALPHAS = (0.0, 0.5, 1.0)
"""The α of Li & Gal (2017), Tables 1–2 (:data:`~bayesgate.models.uci.experiment.PAPER`)."""


class UCIConfigError(InvalidArgument):
    """A :class:`UCIConfig` field out of range, or set where another field leaves it unused
    (``other``): the message names the field and its bad values; ``field``, ``requirement``,
    ``bad`` and ``other`` let a command name its flags instead (:meth:`naming`)."""

    def __init__(
        self, field: str, requirement: str, bad: list[Any], *, other: str | None = None
    ) -> None:
        self.field, self.requirement, self.bad, self.other = field, requirement, bad, other
        super().__init__(self.naming(str))

    def naming(self, name: Callable[[str], str]) -> str:
        """The message with each field named by ``name`` (a command passes its flags'), e.g.
        ``k_test must be ≥ 1, got 0``; a field ``other`` leaves unused:
        ``tau_init applies with learn_tau only (got 2)``."""
        requirement = self.requirement
        if self.other is not None:
            requirement = requirement.format(other=name(self.other))
        if not self.bad:
            return f"{name(self.field)} {requirement}"
        shown = ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in self.bad)
        got = f" (got {shown})" if self.other is not None else f", got {shown}"
        return f"{name(self.field)} {requirement}{got}"


def _repeated(values: tuple[float, ...]) -> list[float]:
    """The values that occur more than once (each once)."""
    return sorted({v for v in values if values.count(v) > 1})


@dataclass(frozen=True)
class UCIConfig:
    """Protocol settings; ``None`` grid entries mean "the dataset folder's file"."""

    alphas: tuple[float, ...] = PAPER_ALPHAS
    k_train: int = 10
    k_val: int = 100
    k_test: int = 10_000
    epochs: int | None = None
    batch_size: int = 128
    lr: float = 1e-2  # Adam; Gal's Keras code used 1e-3 with 10× the epochs (see docs/uci.md)
    lengthscale: float = 1e-2
    val_fraction: float = 0.2
    refit: bool = True
    dropout_rates: tuple[float, ...] | None = None
    tau_values: tuple[float, ...] | None = None
    hidden: int | None = None
    seed: int = 0
    learn_tau: bool = False  # τ a parameter of the energy instead of a grid value
    tau_init: float = 1.0  # learned τ's start, in standardised units (noise std = σ_y)
    tau_lr: float = 0.1  # Adam rate of log τ

    def __post_init__(self) -> None:
        # (field, requirement, the values that break it): the message names the field and the
        # bad value only (the ``uci`` command checks its flags first, naming them)
        checks: list[tuple[str, str, list[Any]]] = [
            ("alphas", "must be ≥ 0", [a for a in self.alphas if not a >= 0]),
            ("alphas", "values must be distinct", _repeated(self.alphas)),
            ("k_train", "must be ≥ 1", [self.k_train] if self.k_train < 1 else []),
            ("k_val", "must be ≥ 1", [self.k_val] if self.k_val < 1 else []),
            ("k_test", "must be ≥ 1", [self.k_test] if self.k_test < 1 else []),
            ("epochs", "must be ≥ 1", [] if self.epochs is None or self.epochs >= 1 else
             [self.epochs]),
            ("batch_size", "must be ≥ 1", [self.batch_size] if self.batch_size < 1 else []),
            ("lr", "must be > 0", [] if self.lr > 0 else [self.lr]),
            ("lengthscale", "must be > 0", [] if self.lengthscale > 0 else [self.lengthscale]),
            ("val_fraction", "must be in (0, 1)", [] if 0 < self.val_fraction < 1 else
             [self.val_fraction]),
            ("hidden", "must be ≥ 1", [] if self.hidden is None or self.hidden >= 1 else
             [self.hidden]),
            ("dropout_rates", "must be in [0, 1)",
             [p for p in self.dropout_rates or () if not 0 <= p < 1]),
            ("tau_values", "must be > 0", [t for t in self.tau_values or () if not t > 0]),
            ("tau_init", "must be > 0", [] if self.tau_init > 0 else [self.tau_init]),
            ("tau_lr", "must be > 0", [] if self.tau_lr > 0 else [self.tau_lr]),
        ]  # fmt: skip
        if not self.alphas:
            raise UCIConfigError("alphas", "need at least one α", [])
        for name, requirement, bad in checks:
            if bad:
                raise UCIConfigError(name, requirement, bad)
        # a setting that cannot apply is refused rather than recorded unused (after the values'
        # own checks, so a bad value is named as such); a field at its default is not "set"
        if self.learn_tau and self.tau_values:
            raise UCIConfigError(
                "tau_values",
                "does not apply with {other}",
                list(self.tau_values),
                other="learn_tau",
            )
        defaults = {f.name: f.default for f in fields(self)}
        for name in ("tau_init", "tau_lr"):
            value = getattr(self, name)
            if not self.learn_tau and value != defaults[name]:
                raise UCIConfigError(name, "applies with {other} only", [value], other="learn_tau")

    def resolved(self, ds: UCIDataset) -> dict[str, Any]:
        """The settings with the dataset's grid filled in (what a result file records)."""
        out = asdict(self)
        out["epochs"] = self.epochs or ds.grid.n_epochs
        out["hidden"] = self.hidden or ds.grid.n_hidden
        out["dropout_rates"] = list(self.dropout_rates or ds.grid.dropout_rates)
        out["tau_values"] = [] if self.learn_tau else list(self.tau_values or ds.grid.tau_values)
        out["alphas"] = list(self.alphas)
        return out
