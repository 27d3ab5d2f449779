"""Detection metrics for a score that should be higher on adversarial than on clean inputs.

Convention everywhere: ``neg`` are the scores of clean inputs, ``pos`` those of (successful)
adversarial inputs, both 1-D; an input is **flagged** when ``score > threshold``. All arithmetic is
in float64 numpy.

- :func:`threshold_at_fpr` — the rejection threshold: with ``n`` clean scores sorted ascending
  ``s_(1) ≤ … ≤ s_(n)`` and ``m = ⌊target·n⌋`` the number of clean inputs we may flag, the
  threshold is ``t = s_(n−m)`` (``s_(n)`` when ``m = 0``), a lower ``(1 − target)`` quantile. Then
  ``#{s > t} ≤ m``: the realised false-positive rate never exceeds the target, and it is lower when
  scores tie at ``t`` (a discrete score such as the variation ratio).
- :func:`auroc` — ``P(S_pos > S_neg) + ½·P(S_pos = S_neg)``, the Mann–Whitney statistic
  ``U / (n_pos·n_neg)`` with ``U = R_pos − n_pos(n_pos+1)/2`` and mid-ranks for ties.
- :func:`tpr_at_fpr`, :func:`fpr_at_tpr` — operating points of the empirical ROC.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

_EPS = 1e-9  # absorbs round-off in target·n (0.29·100 = 28.999…)


def _scores(values: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} scores must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"no {name} scores")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} scores contain NaN or infinite values")
    return arr


def _check_rate(rate: float, name: str) -> None:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {rate}")


def threshold_at_fpr(neg: ArrayLike, target_fpr: float) -> float:
    """Largest-flagging threshold whose false-positive rate on ``neg`` is ``≤ target_fpr``.

    ``t = s_(n−m)`` with ``m = ⌊target_fpr·n⌋`` (1-based order statistics of the clean scores);
    see the module docstring. ``flag_rate(neg, t) ≤ target_fpr`` always holds.
    """
    s = np.sort(_scores(neg, "clean"))
    _check_rate(target_fpr, "target false-positive rate")
    m = min(math.floor(target_fpr * s.size + _EPS), s.size)
    if m >= s.size:
        return float(np.nextafter(s[0], -np.inf))  # flag everything (target_fpr = 1)
    return float(s[s.size - 1 - m])


def flag_rate(scores: ArrayLike, threshold: float) -> float:
    """Fraction of ``scores`` flagged, ``mean(score > threshold)``."""
    s = _scores(scores, "input")
    return float(np.mean(s > threshold))


def auroc(neg: ArrayLike, pos: ArrayLike) -> float:
    """Area under the ROC curve by the Mann–Whitney U statistic with mid-ranks for ties.

    ``AUROC = (R_pos − n_pos(n_pos+1)/2) / (n_pos·n_neg)`` where ``R_pos`` is the sum of the
    (mid-)ranks of the positive scores in the pooled sample; equals
    ``P(S_pos > S_neg) + ½·P(S_pos = S_neg)``.
    """
    n_neg_arr, pos_arr = _scores(neg, "clean"), _scores(pos, "adversarial")
    pooled = np.concatenate([n_neg_arr, pos_arr])
    _, inverse, counts = np.unique(pooled, return_inverse=True, return_counts=True)
    # Mid-rank of each distinct value: ranks (1-based) of a tie group [c0+1 … c0+cnt] average to
    # c0 + (cnt+1)/2, with c0 the number of strictly smaller values.
    below = np.cumsum(counts) - counts
    mid_rank = below + (counts + 1) / 2.0
    r_pos = mid_rank[inverse[n_neg_arr.size :]].sum()
    n_p, n_n = pos_arr.size, n_neg_arr.size
    return float((r_pos - n_p * (n_p + 1) / 2.0) / (n_p * n_n))


def roc_curve(neg: ArrayLike, pos: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empirical ROC ``(fpr, tpr, thresholds)`` for the rule ``score > t``.

    Thresholds run from ``+∞`` (nothing flagged: point (0, 0)) down through every distinct score
    ``v`` as ``t`` just below ``v`` (so ``score ≥ v`` is flagged), ending at (1, 1). Ties give
    diagonal segments, whose trapezoid area is the mid-rank AUROC.
    """
    n_arr, p_arr = _scores(neg, "clean"), _scores(pos, "adversarial")
    values = np.unique(np.concatenate([n_arr, p_arr]))[::-1]
    n_sorted, p_sorted = np.sort(n_arr), np.sort(p_arr)
    # Number of scores ≥ v = size − number strictly below v.
    fp = n_arr.size - np.searchsorted(n_sorted, values, side="left")
    tp = p_arr.size - np.searchsorted(p_sorted, values, side="left")
    fpr = np.concatenate([[0.0], fp / n_arr.size])
    tpr = np.concatenate([[0.0], tp / p_arr.size])
    thresholds = np.concatenate([[np.inf], np.nextafter(values, -np.inf)])
    return fpr, tpr, thresholds


def tpr_at_fpr(neg: ArrayLike, pos: ArrayLike, fpr: float = 0.05) -> float:
    """True-positive rate at the threshold :func:`threshold_at_fpr` fixes on ``neg``.

    This is the best TPR any threshold reaches with a clean false-positive rate ``≤ fpr``.
    """
    return flag_rate(pos, threshold_at_fpr(neg, fpr))


def fpr_at_tpr(neg: ArrayLike, pos: ArrayLike, tpr: float = 0.95) -> float:
    """Smallest false-positive rate of a threshold that flags at least ``tpr`` of ``pos``.

    With ``m = ⌈tpr·n_pos⌉`` and ``v`` the m-th largest positive score, the best threshold sits
    just below ``v``; the FPR is ``mean(neg ≥ v)``.
    """
    n_arr, p_arr = _scores(neg, "clean"), _scores(pos, "adversarial")
    _check_rate(tpr, "true-positive rate")
    m = math.ceil(tpr * p_arr.size - _EPS)
    if m <= 0:  # flagging nothing meets a TPR of 0: a threshold above every score, FPR 0
        return 0.0
    v = np.sort(p_arr)[::-1][m - 1]
    return float(np.mean(n_arr >= v))


def detection_metrics(
    neg: ArrayLike, pos: ArrayLike, threshold: float | None = None
) -> dict[str, Any]:
    """AUROC, TPR at 5 % FPR, FPR at 95 % TPR (and TPR/FPR at ``threshold`` if given).

    With no positive scores (no successful adversarial example) the positive-based metrics are
    ``None``: they are undefined, not zero.
    """
    n_arr = _scores(neg, "clean")
    p_arr = np.asarray(pos, dtype=np.float64)
    out: dict[str, Any] = {"n_clean": int(n_arr.size), "n_adversarial": int(p_arr.size)}
    has_pos = p_arr.size > 0
    out["auroc"] = auroc(n_arr, p_arr) if has_pos else None
    out["tpr_at_5fpr"] = tpr_at_fpr(n_arr, p_arr, 0.05) if has_pos else None
    out["fpr_at_95tpr"] = fpr_at_tpr(n_arr, p_arr, 0.95) if has_pos else None
    out["mean_clean"] = float(n_arr.mean())
    out["mean_adversarial"] = float(p_arr.mean()) if has_pos else None
    if threshold is not None:
        out["tpr_at_threshold"] = flag_rate(p_arr, threshold) if has_pos else None
        out["fpr_at_threshold"] = flag_rate(n_arr, threshold)
    return out
