"""The settings of adversarial training (:class:`AdversarialConfig`) and its methods, without
torch.

Why a module of its own: ``bayesgate train --adversarial`` offers :data:`ADVERSARIAL_METHODS` and
checks its inner attack's settings before anything is loaded or trained. Read from here, its
``--help`` and a setting it refuses answer without importing torch (~3 s); the inner attack itself
(:mod:`.adversarial`, torch) imports them. What each setting does is said there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bayesgate.errors import InvalidArgument

ADVERSARIAL_METHODS = ("pgd", "fgsm-rs")


@dataclass(frozen=True)
class AdversarialConfig:
    """The inner maximisation of adversarial training (stored in the model card)."""

    method: str = "pgd"
    eps: float = 0.3
    steps: int = 7  # PGD only; FGSM-RS takes one step
    step_size: float | None = None  # at full ε; default 2.5·ε/steps (PGD), 1.25·ε (FGSM-RS)
    eps_ramp_epochs: float = 0.0
    clean_mix: float = 0.0
    attack_k: int = 1  # MC passes per attack step
    alpha: float = 0.5  # α of the energy the attack ascends (the trainer's)
    monitor_size: int = 500  # held-out images of the per-epoch clean / robust accuracy
    # L1 examples beside the L∞ ones (Tramèr & Boneh 2019); l1_eps 0 = none (then the L1 keys
    # are left out of as_dict, so cards and checkpoints of L∞-only runs read as before)
    l1_eps: float = 0.0
    l1_share: float = 0.5  # of the attacked examples of a minibatch, the last ones
    l1_steps: int = 10
    l1_step_size: float | None = None  # at full ε₁; default 2.5·ε₁/l1_steps
    l1_sparsity: float = 99.0  # percentile of |∇| above which a pixel moves in a step

    def __post_init__(self) -> None:
        checks = [
            (
                self.method in ADVERSARIAL_METHODS,
                f"adversarial method must be one of {', '.join(ADVERSARIAL_METHODS)}, "
                f"got {self.method!r}",
            ),
            (0 < self.eps <= 1, f"eps must be in (0, 1], got {self.eps}"),
            (self.steps >= 1, f"attack steps must be ≥ 1, got {self.steps}"),
            (
                self.step_size is None or self.step_size > 0,
                f"attack step size must be > 0, got {self.step_size}",
            ),
            (self.eps_ramp_epochs >= 0, f"eps ramp must be ≥ 0 epochs, got {self.eps_ramp_epochs}"),
            (0 <= self.clean_mix < 1, f"clean mix must be in [0, 1), got {self.clean_mix}"),
            (self.attack_k >= 1, f"attack k must be ≥ 1, got {self.attack_k}"),
            (self.alpha >= 0, f"alpha must be ≥ 0, got {self.alpha}"),
            (self.monitor_size >= 0, f"monitor size must be ≥ 0, got {self.monitor_size}"),
            (self.l1_eps >= 0, f"l1 eps must be ≥ 0, got {self.l1_eps}"),
            (0 < self.l1_share <= 1, f"l1 share must be in (0, 1], got {self.l1_share}"),
            (self.l1_steps >= 1, f"l1 steps must be ≥ 1, got {self.l1_steps}"),
            (
                self.l1_step_size is None or self.l1_step_size > 0,
                f"l1 step size must be > 0, got {self.l1_step_size}",
            ),
            (
                0 < self.l1_sparsity < 100,
                f"l1 sparsity must be in (0, 100), got {self.l1_sparsity}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message)

    @property
    def n_steps(self) -> int:
        return 1 if self.method == "fgsm-rs" else self.steps

    def step_at(self, eps: float) -> float:
        """Step size at radius ``eps``: the configured one scaled by ``eps/ε``, else the default."""
        if self.step_size is not None:
            return self.step_size * eps / self.eps
        return 1.25 * eps if self.method == "fgsm-rs" else 2.5 * eps / self.steps

    def l1_step_at(self, eps1: float) -> float:
        """L1 step length at L1 radius ``eps1``: the configured one scaled by ``eps1/ε₁``, else
        ``2.5·eps1/l1_steps``."""
        if self.l1_step_size is not None:
            return self.l1_step_size * eps1 / self.l1_eps
        return 2.5 * eps1 / self.l1_steps

    def l1_rows(self, attacked: int) -> int:
        """How many of ``attacked`` examples get the L1 attack: ``round(l1_share·attacked)``,
        none without ``l1_eps``."""
        return round(self.l1_share * attacked) if self.l1_eps > 0 else 0

    def as_dict(self) -> dict[str, Any]:
        """The settings; without L1 examples (``l1_eps`` 0) the L1 keys are left out, as in the
        cards and checkpoints written before they existed."""
        settings = asdict(self)
        if self.l1_eps == 0:
            for key in [key for key in settings if key.startswith("l1_")]:
                del settings[key]
        return settings
