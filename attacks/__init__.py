"""Adversarial attacks on the MC log-predictive, threshold calibration and the paper's sweeps.

- :mod:`bayesgate.attacks.model_fn` — the attacked function ``x ↦ log p̄(·|x)`` over K dropout
  passes.
- :mod:`bayesgate.attacks.methods` — one class per attack (FGS, the paper's targeted iterative
  FGS, PGD, CW-L2; cleverhans underneath) and the name → class registry ``ATTACKS``.
- :mod:`bayesgate.attacks.specs` — attacks parsed from ``NAME:key=value,…`` through the registry.
- :mod:`bayesgate.attacks.run` — seeded, batched runs over a data set with success verdicts
  (``.npz``).
- :mod:`bayesgate.attacks.pipeline` — the clean → attack → record pipeline of ``calibrate`` and the
  detection sweep.
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
# extra (the attack classes import cleverhans only when they run).
_EXPORTS = {
    "ATTACKS": "bayesgate.attacks.methods",
    "Attack": "bayesgate.attacks.methods",
    "FGS": "bayesgate.attacks.methods",
    "TargetedFGS": "bayesgate.attacks.methods",
    "PGD": "bayesgate.attacks.methods",
    "CWL2": "bayesgate.attacks.methods",
    "auroc": "bayesgate.attacks.metrics",
    "fpr_at_tpr": "bayesgate.attacks.metrics",
    "roc_curve": "bayesgate.attacks.metrics",
    "threshold_at_fpr": "bayesgate.attacks.metrics",
    "tpr_at_fpr": "bayesgate.attacks.metrics",
    "log_predictive_fn": "bayesgate.attacks.model_fn",
    "parse_attack": "bayesgate.attacks.specs",
    "parse_attacks": "bayesgate.attacks.specs",
    "DEFAULT_ATTACKS": "bayesgate.attacks.specs",
    "run_attack": "bayesgate.attacks.run",
    "detection_run": "bayesgate.attacks.pipeline",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'bayesgate.attacks' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
