"""The attacks, one class per module, and the registry that names them.

:data:`ATTACKS` maps a spec name to its class; the spec parser (:mod:`bayesgate.attacks.specs`),
:func:`bayesgate.attacks.run.run_attack` and the CLI read it and nothing else. Adding an attack is
one class (a frozen dataclass deriving from :class:`Attack`, in its own module here) and one entry
in the :func:`attack_registry` call below.

| name | class | what |
|---|---|---|
| ``fgs`` | :class:`FGS` | untargeted Fast Gradient Sign, one step |
| ``targeted`` | :class:`TargetedFGS` | the paper's targeted iterative FGS |
| ``pgd`` | :class:`PGD` | untargeted L∞ PGD with a random start |
| ``cw`` | :class:`CWL2` | untargeted Carlini–Wagner L2 |
| ``apgd`` | :class:`APGD` | Auto-PGD with the CE or DLR loss (Croce & Hein 2020) |
| ``pgd-restarts`` | :class:`PGDRestarts` | L∞ PGD with random restarts, largest-loss iterate kept |
| ``square`` | :class:`Square` | black-box L∞ Square Attack (queries only, no gradients) |

cleverhans is imported when an attack runs, so parsing specs and building the CLI work without the
``[attacks]`` extra.
"""

from __future__ import annotations

from bayesgate.attacks.methods.apgd import APGD
from bayesgate.attacks.methods.base import Attack, AttackInput, StepCallback, attack_registry
from bayesgate.attacks.methods.cw import CWL2
from bayesgate.attacks.methods.fgs import FGS
from bayesgate.attacks.methods.pgd import PGD
from bayesgate.attacks.methods.pgd_restarts import PGDRestarts
from bayesgate.attacks.methods.square import Square
from bayesgate.attacks.methods.targeted import TargetedFGS

ATTACKS: dict[str, type[Attack]] = attack_registry(
    FGS, TargetedFGS, PGD, CWL2, APGD, PGDRestarts, Square
)
"""Spec name → attack class, in the order help texts list them."""

__all__ = [
    "APGD",
    "ATTACKS",
    "CWL2",
    "FGS",
    "PGD",
    "Attack",
    "AttackInput",
    "PGDRestarts",
    "Square",
    "StepCallback",
    "TargetedFGS",
]
