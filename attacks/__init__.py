"""Adversarial attacks on the MC log-predictive, threshold calibration and the paper's sweeps.

- :mod:`bayesgate.attacks.model_fn` — the attacked function ``x ↦ log p̄(·|x)`` over K dropout
passes.
- :mod:`bayesgate.attacks.methods` — FGS, the paper's targeted iterative FGS, PGD and CW-L2 on one
batch
  (cleverhans underneath).
- :mod:`bayesgate.attacks.specs` — attack specifications parsed from ``NAME:key=value,…``.
- :mod:`bayesgate.attacks.run` — seeded, batched runs over a data set with success verdicts
(``.npz``).
- :mod:`bayesgate.attacks.metrics` — thresholds at a target FPR, AUROC (Mann–Whitney), ROC points.
- :mod:`bayesgate.attacks.calibrate` — ``calibration.json``: thresholds on validation, metrics on
test.
- :mod:`bayesgate.attacks.report`, :mod:`bayesgate.attacks.plots` — Markdown report and PNG plots.
- :mod:`bayesgate.attacks.sweep` — Figures 6–7 of Li & Gal (2017) and the detection table.
- :mod:`bayesgate.attacks.cli` — ``bayesgate attack``, ``bayesgate calibrate``, ``bayesgate sweep``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names and their modules, imported on first use so that ``bayesgate --help`` (which
# imports bayesgate.attacks.cli) works without cleverhans and matplotlib, the optional [attacks]
# extra.
_EXPORTS = {
    "fgs": "bayesgate.attacks.methods",
    "targeted_iterative_fgs": "bayesgate.attacks.methods",
    "pgd": "bayesgate.attacks.methods",
    "cw_l2": "bayesgate.attacks.methods",
    "auroc": "bayesgate.attacks.metrics",
    "fpr_at_tpr": "bayesgate.attacks.metrics",
    "roc_curve": "bayesgate.attacks.metrics",
    "threshold_at_fpr": "bayesgate.attacks.metrics",
    "tpr_at_fpr": "bayesgate.attacks.metrics",
    "log_predictive_fn": "bayesgate.attacks.model_fn",
    "AttackSpec": "bayesgate.attacks.specs",
    "DEFAULT_ATTACKS": "bayesgate.attacks.specs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attacks' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
