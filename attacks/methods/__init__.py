"""The attacks, one class per module, and the registry that names them.

:data:`ATTACKS` maps a spec name to its class; the spec parser (:mod:`bayesgate.attacks.specs`),
:func:`bayesgate.attacks.run.run_attack` and the CLI read it and nothing else. Each attack's
parameters (fields, defaults, checks, label) are declared without torch in
:mod:`.parameters` (:data:`ATTACK_PARAMETERS`), which the command line's parsers read; the class
here derives from them and adds the computation. Adding an attack is its parameters class and one
entry in :data:`ATTACK_PARAMETERS` (:mod:`.parameters`), and its class (deriving from the
parameters class and :class:`Attack`, in its own module here) and one entry in the
:func:`attack_registry` call of :mod:`.registry` (the two tables are checked against each other).

| name | class | what |
|---|---|---|
| ``fgs`` | :class:`FGS` | untargeted Fast Gradient Sign, one step |
| ``targeted`` | :class:`TargetedFGS` | the paper's targeted iterative FGS |
| ``pgd`` | :class:`PGD` | untargeted L∞ PGD with a random start |
| ``cw`` | :class:`CWL2` | untargeted Carlini–Wagner L2 |
| ``apgd`` | :class:`APGD` | Auto-PGD with the CE or DLR loss (Croce & Hein 2020) |
| ``pgd-restarts`` | :class:`PGDRestarts` | L∞ PGD with random restarts, largest-loss iterate kept |
| ``square`` | :class:`Square` | black-box L∞ Square Attack (queries only, no gradients) |
| ``slide`` | :class:`SLIDE` | untargeted sparse L1 descent (Tramèr & Boneh 2019) |
| ``sparse-rs`` | :class:`SparseRS` | black-box L0 random search (Croce et al. 2022) |

cleverhans is imported when an attack runs, so parsing specs and building the CLI work without the
``[attacks]`` extra. The names below are imported on first use: importing :mod:`.parameters`
(which ``bayesgate attack --help`` does) must not import the attack classes, which import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bayesgate.lazy import lazy_names

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time, __getattr__ below
    from bayesgate.attacks.methods.apgd import APGD
    from bayesgate.attacks.methods.base import Attack, AttackInput, StepCallback
    from bayesgate.attacks.methods.cw import CWL2
    from bayesgate.attacks.methods.fgs import FGS
    from bayesgate.attacks.methods.parameters import ATTACK_PARAMETERS, AttackParameters
    from bayesgate.attacks.methods.pgd import PGD
    from bayesgate.attacks.methods.pgd_restarts import PGDRestarts
    from bayesgate.attacks.methods.registry import ATTACKS
    from bayesgate.attacks.methods.slide import SLIDE
    from bayesgate.attacks.methods.sparse_rs import SparseRS
    from bayesgate.attacks.methods.square import Square
    from bayesgate.attacks.methods.targeted import TargetedFGS

_SOURCES = {
    "APGD": "apgd",
    "ATTACKS": "registry",
    "ATTACK_PARAMETERS": "parameters",
    "Attack": "base",
    "AttackInput": "base",
    "AttackParameters": "parameters",
    "CWL2": "cw",
    "FGS": "fgs",
    "PGD": "pgd",
    "PGDRestarts": "pgd_restarts",
    "SLIDE": "slide",
    "SparseRS": "sparse_rs",
    "Square": "square",
    "StepCallback": "base",
    "TargetedFGS": "targeted",
}

__all__ = [  # the names of _SOURCES (a test checks that each resolves)
    "APGD",
    "ATTACKS",
    "ATTACK_PARAMETERS",
    "CWL2",
    "FGS",
    "PGD",
    "SLIDE",
    "Attack",
    "AttackInput",
    "AttackParameters",
    "PGDRestarts",
    "SparseRS",
    "Square",
    "StepCallback",
    "TargetedFGS",
]

__getattr__, __dir__ = lazy_names(__name__, _SOURCES, globals())
