""":data:`ATTACKS`, spec name → attack class: the implementations (torch) of the parameters that
:data:`~bayesgate.attacks.methods.parameters.ATTACK_PARAMETERS` declares without torch.

Both tables name the same attacks in the same order, each class here a subclass of its parameters
class with the same parameters: checked on import, so the two cannot drift apart.
"""

from __future__ import annotations

from bayesgate.attacks.methods.apgd import APGD
from bayesgate.attacks.methods.base import Attack, attack_registry
from bayesgate.attacks.methods.cw import CWL2
from bayesgate.attacks.methods.fgs import FGS
from bayesgate.attacks.methods.parameters import (
    ATTACK_PARAMETERS,
    AttackParameters,
    parameter_defaults,
)
from bayesgate.attacks.methods.pgd import PGD
from bayesgate.attacks.methods.pgd_restarts import PGDRestarts
from bayesgate.attacks.methods.slide import SLIDE
from bayesgate.attacks.methods.sparse_rs import SparseRS
from bayesgate.attacks.methods.square import Square
from bayesgate.attacks.methods.targeted import TargetedFGS


def check_implements(
    attacks: dict[str, type[Attack]], parameters: dict[str, type[AttackParameters]]
) -> None:
    """``TypeError`` unless ``attacks`` implements exactly ``parameters``: the same names in the
    same order, each attack class deriving from its parameters class, with its parameters."""
    if list(attacks) != list(parameters):
        raise TypeError(
            f"the attack classes ({', '.join(attacks)}) are not those whose parameters are "
            f"declared ({', '.join(parameters)}), in that order"
        )
    for name, cls in attacks.items():
        declared = parameters[name]
        if not issubclass(cls, declared) or parameter_defaults(cls) != parameter_defaults(declared):
            raise TypeError(f"{cls.__name__} must derive from {declared.__name__}, adding no field")


ATTACKS: dict[str, type[Attack]] = attack_registry(
    FGS, TargetedFGS, PGD, CWL2, APGD, PGDRestarts, Square, SLIDE, SparseRS
)
"""Spec name → attack class, in the order help texts list them."""
check_implements(ATTACKS, ATTACK_PARAMETERS)
