"""Per-example losses the robust-evaluation attacks ascend, on the MC log-predictive ``z``.

``z = log p̄(·|x)`` (``B×C``, :mod:`bayesgate.attacks.model_fn`) plays the part of the logits:
both losses are invariant to adding a constant per row, and ``log p̄`` differs from the logits
of ``p̄`` by exactly such a constant.

- cross-entropy ``CE(z, y) = −log softmax(z)_y`` (``= −log p̄(y|x)`` since ``Σ_c p̄_c = 1``);
- difference of logits ratio (Croce & Hein 2020, eq. 6)
  ``DLR(z, y) = −(z_y − max_{i≠y} z_i) / (z_π1 − z_π3 + 10⁻¹²)`` with ``z_π1 ≥ z_π2 ≥ z_π3 ≥ …``
  the sorted components; invariant to shifts and positive rescaling of ``z``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bayesgate.attacks.methods.parameters import APGD_LOSSES
from bayesgate.tables import keyed_by

AttackLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``(z B×C, y B) ↦ B`` per-example losses, larger = closer to a misclassification."""

DLR_EPS = 1e-12


def cross_entropy_loss(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``−log softmax(z)_y`` per example (``B``)."""
    return -torch.log_softmax(z, dim=1).gather(1, y[:, None]).squeeze(1)


def dlr_loss(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``−(z_y − max_{i≠y} z_i) / (z_π1 − z_π3 + 10⁻¹²)`` per example (``B``); needs C ≥ 3."""
    if z.shape[1] < 3:
        raise ValueError(f"the DLR loss needs at least 3 classes, got {z.shape[1]}")
    top = z.sort(dim=1, descending=True).values
    z_y = z.gather(1, y[:, None]).squeeze(1)
    others = z.scatter(1, y[:, None], float("-inf"))
    return -(z_y - others.max(dim=1).values) / (top[:, 0] - top[:, 2] + DLR_EPS)


LOSSES: dict[str, AttackLoss] = keyed_by(
    APGD_LOSSES, {"ce": cross_entropy_loss, "dlr": dlr_loss}, "APGD losses"
)
"""Loss name (:data:`~bayesgate.attacks.methods.parameters.APGD_LOSSES`) → its function."""
