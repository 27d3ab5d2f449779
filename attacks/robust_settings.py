"""What ``bayesgate evaluate-robust`` runs (:class:`RobustSettings`) and its checks, without torch.

Why a module of its own: ``evaluate-robust`` shows these settings' defaults and attacks in its
``--help`` and checks them before any model is loaded; read from here, they answer without
importing torch (~3 s). The evaluation (:mod:`bayesgate.attacks.robust_eval`, torch) imports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from bayesgate.errors import InvalidArgument, check_at_least

ROBUST_ATTACKS = ("pgd", "apgd-ce", "apgd-dlr")
"""The attacks of the table, worst of (:func:`bayesgate.attacks.robust_eval.attacks_at`)."""


@dataclass(frozen=True)
class RobustSettings:
    """What ``evaluate-robust`` runs (stored in its JSON)."""

    eps: tuple[float, ...] = (0.1, 0.2, 0.3)
    n: int = 1000
    attacks: tuple[str, ...] = ROBUST_ATTACKS
    pgd_steps: int = 100
    restarts: int = 5
    apgd_steps: int = 100
    k_attack: int = 10
    k_eval: int = 100
    batch_size: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [a for a in self.attacks if a not in ROBUST_ATTACKS]
        checks = [
            (bool(self.attacks), f"give at least one attack ({', '.join(ROBUST_ATTACKS)})"),
            (not unknown, f"unknown attacks {unknown}; choose from {', '.join(ROBUST_ATTACKS)}"),
            (bool(self.eps), "give at least one eps"),
            (all(0 < e <= 1 for e in self.eps), f"every eps must be in (0, 1], got {self.eps}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidArgument(message)
        # the fields are evaluate-robust's flags: name the one to change
        for name in (
            "n",
            "pgd_steps",
            "restarts",
            "apgd_steps",
            "k_attack",
            "k_eval",
            "batch_size",
        ):
            check_at_least("--" + name.replace("_", "-"), getattr(self, name))
