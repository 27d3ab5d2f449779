"""Adversarial attacks on the MC log-predictive, threshold calibration and the paper's sweeps.

- :mod:`attacks.model_fn` — the attacked function ``x ↦ log p̄(·|x)`` over K dropout passes.
- :mod:`attacks.methods` — FGS, the paper's targeted iterative FGS, PGD and CW-L2 on one batch
  (cleverhans underneath).
- :mod:`attacks.specs` — attack specifications parsed from ``NAME:key=value,…``.
- :mod:`attacks.run` — seeded, batched runs over a data set with success verdicts (``.npz``).
- :mod:`attacks.metrics` — thresholds at a target FPR, AUROC (Mann–Whitney), ROC points.
- :mod:`attacks.calibrate` — ``calibration.json``: thresholds on validation, metrics on test.
- :mod:`attacks.report`, :mod:`attacks.plots` — Markdown report and PNG plots.
- :mod:`attacks.sweep` — Figures 6–7 of Li & Gal (2017) and the detection table.
- :mod:`attacks.cli` — ``bayesgate attack``, ``bayesgate calibrate``, ``bayesgate sweep``.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public names and their modules, imported on first use so that ``bayesgate --help`` (which
# imports attacks.cli) works without cleverhans and matplotlib, the optional [attacks] extra.
_EXPORTS = {
    "fgs": "attacks.methods",
    "targeted_iterative_fgs": "attacks.methods",
    "pgd": "attacks.methods",
    "cw_l2": "attacks.methods",
    "auroc": "attacks.metrics",
    "fpr_at_tpr": "attacks.metrics",
    "roc_curve": "attacks.metrics",
    "threshold_at_fpr": "attacks.metrics",
    "tpr_at_fpr": "attacks.metrics",
    "log_predictive_fn": "attacks.model_fn",
    "AttackSpec": "attacks.specs",
    "DEFAULT_ATTACKS": "attacks.specs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attacks' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
