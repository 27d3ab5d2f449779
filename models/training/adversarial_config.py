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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
