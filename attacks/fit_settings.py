"""What ``bayesgate fit-detector`` uses (:class:`FitSettings`) and its checks, without torch.

Why a module of its own: ``fit-detector`` shows these settings' defaults in its ``--help`` and
checks them (:meth:`FitSettings.check`) before the model is loaded and its features extracted;
read from here, they answer without importing torch (~3 s). The fitting
(:mod:`bayesgate.attacks.detector_fit`, torch) imports them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bayesgate.attacks.specs import DEFAULT_ATTACKS, parse_parameter_list
from bayesgate.errors import InvalidArgument

RULES = ("min-p", "logistic")
"""``fused`` = the minimum conformal p-value of
:data:`~bayesgate.attacks.detector_fit.MIN_P_SCORES` against the fit part's clean scores
(:mod:`bayesgate.models.detection.conformal`, the default), or the logistic logit."""
OUTLIER_KINDS = ("chimera", "patches", "overlay")
"""The synthetic outliers the fusion may add to its positives
(:data:`bayesgate.attacks.outliers.OUTLIERS`, checked to implement these names on import)."""


@dataclass(frozen=True)
class FitSettings:
    """What ``fit-detector`` uses; ``None`` = the card's ``k_test`` / ``k_attack`` / all images."""

    k: int | None = None
    k_attack: int | None = None
    attacks: tuple[str, ...] = DEFAULT_ATTACKS
    train_subset: int | None = None
    fit_images: int = 5000
    threshold_images: int = 5000
    attack_images: int = 2000
    kde_per_class: int = 500
    kde_dtype: str = "float32"
    shrinkage: float | None = None
    trunk_grid: bool = False
    outliers: tuple[str, ...] = ()
    outlier_share: float = 0.5
    l2: float = 1e-3
    rule: str = "min-p"
    target_fpr: float = 0.05
    seed: int = 0
    batch_size: int = 100

    def check(self) -> None:
        parse_parameter_list(self.attacks)  # the specs, before the features are extracted
        for name in ("fit_images", "threshold_images", "attack_images", "kde_per_class"):
            if getattr(self, name) < 1:
                raise InvalidArgument(
                    f"{name.replace('_', '-')} must be ≥ 1, got {getattr(self, name)}"
                )
        if self.attack_images > self.fit_images:
            raise InvalidArgument(
                "attack-images must be ≤ fit-images (the attacked images are fit images)"
            )
        if not 0.0 < self.target_fpr < 1.0:
            raise InvalidArgument(
                f"target false-positive rate must be in (0, 1), got {self.target_fpr}"
            )
        if self.rule not in RULES:
            raise InvalidArgument(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        unknown = [kind for kind in self.outliers if kind not in OUTLIER_KINDS]
        if unknown:
            raise InvalidArgument(
                f"unknown outlier kind(s) {', '.join(unknown)}; "
                f"choose from {', '.join(OUTLIER_KINDS)}"
            )
        if len(set(self.outliers)) != len(self.outliers):
            raise InvalidArgument(f"outliers: a kind is named twice in {list(self.outliers)}")
        if self.outliers and not 0.0 < self.outlier_share < 1.0:
            raise InvalidArgument(f"outlier-share must be in (0, 1), got {self.outlier_share}")
        if not (math.isfinite(self.l2) and self.l2 > 0):
            raise InvalidArgument(f"l2 must be a finite number > 0, got {self.l2}")
        # fit_class_gaussians' rule (None: Ledoit–Wolf), checked before the feature extraction
        if self.shrinkage is not None and not 0.0 <= self.shrinkage <= 1.0:
            raise InvalidArgument(
                f"shrinkage must be in [0, 1] (omit it for Ledoit–Wolf), got {self.shrinkage}"
            )
