"""What ``bayesgate detect-eval`` runs (:class:`EvalSettings`) and its default attacks, without
torch.

Why a module of its own: ``detect-eval`` shows these defaults in its ``--help`` and checks its
settings (:meth:`EvalSettings.check`: the OOD sets, the attack specs, ``--attack-limit``) before
the model is loaded; read from here, they answer without importing torch (~3 s). The evaluation
(:mod:`bayesgate.attacks.detect_eval`, torch) imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bayesgate.attacks.methods.parameters import AttackParameters
from bayesgate.attacks.ood_names import DEFAULT_OOD, OOD_NAMES
from bayesgate.attacks.specs import DEFAULT_ATTACKS, parse_attacks, parse_parameter_list
from bayesgate.errors import InvalidArgument

if TYPE_CHECKING:
    from bayesgate.attacks.methods import Attack

SEEN_ATTACKS = DEFAULT_ATTACKS
"""The attacks ``fit-detector`` fits the fusion on by default (FGS, targeted)."""
UNSEEN_ATTACKS = ("pgd:eps=0.3,eps_iter=0.01,steps=40", "cw", "square:eps=0.3,queries=1000")
EVAL_ATTACKS = SEEN_ATTACKS + UNSEEN_ATTACKS
"""What ``bayesgate detect-eval`` runs unless told otherwise: the attacks the fusion was fitted on
(FGS, targeted — evaluated on test images it never saw) and the unseen ones."""


@dataclass(frozen=True)
class EvalSettings:
    """Test subset (``limit`` first images; ``attack_limits`` caps single attacks, e.g. CW), K of
    the scores (``None``: the detector's), K of the attacks (``None``: the card's ``k_attack``)."""

    attacks: tuple[str, ...] = EVAL_ATTACKS
    ood: tuple[str, ...] = DEFAULT_OOD
    limit: int | None = 1000
    attack_limits: dict[str, int] = field(default_factory=dict)
    k: int | None = None
    k_attack: int | None = None
    seed: int = 0
    batch_size: int = 100
    cache_dir: Path | None = None

    def check(self) -> None:
        """:class:`InvalidArgument` for a setting the run cannot use; also parses the attacks
        (their checked parameters: no torch)."""
        unknown = [name for name in self.ood if name not in OOD_NAMES]
        if unknown:
            raise InvalidArgument(
                f"unknown OOD set(s) {unknown}; choose from {', '.join(OOD_NAMES)}"
            )
        if self.limit is not None and self.limit < 1:
            raise InvalidArgument(f"limit must be ≥ 1, got {self.limit}")
        for name, n in self.attack_limits.items():
            if n < 1:
                raise InvalidArgument(f"--attack-limit {name}={n}: must be ≥ 1")
        names = list(dict.fromkeys(a.name for a in self.parameters()))
        for name, n in self.attack_limits.items():
            if name not in names:  # a typo or a wrong case would silently limit nothing
                raise InvalidArgument(
                    f"--attack-limit {name}={n}: no attack {name!r} in this run "
                    f"(its attacks: {', '.join(names) or 'none'})"
                )

    def parameters(self) -> list[AttackParameters]:
        """The parsed :attr:`attacks`' checked parameters (none if empty), without torch."""
        return parse_parameter_list(self.attacks) if self.attacks else []

    def specs(self) -> list[Attack]:
        """The parsed :attr:`attacks` (none if empty; the attack classes import torch)."""
        return parse_attacks(list(self.attacks)) if self.attacks else []
