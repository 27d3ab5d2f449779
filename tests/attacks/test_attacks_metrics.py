"""bayesgate.attacks.metrics against hand-made score arrays and brute-force float64 references."""

from __future__ import annotations

import numpy as np
import pytest

from bayesgate.attacks.metrics import (
    auroc,
    detection_metrics,
    flag_rate,
    fpr_at_tpr,
    roc_curve,
    threshold_at_fpr,
    tpr_at_fpr,
)


def _brute_auroc(neg: np.ndarray, pos: np.ndarray) -> float:
    """Pairwise count: P(pos > neg) + ½ P(pos = neg)."""
    diff = pos[:, None].astype(np.float64) - neg[None, :].astype(np.float64)
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def _candidate_thresholds(*arrays: np.ndarray) -> np.ndarray:
    """Every threshold that gives a distinct flag set: below the minimum, and each value."""
    values = np.unique(np.concatenate(arrays))
    return np.concatenate([[values[0] - 1.0], values])


# --- threshold at a target false-positive rate ------------------------------------------------


def test_threshold_distinct_scores_hits_target_exactly() -> None:
    scores = np.arange(1.0, 101.0)  # 1 … 100
    t = threshold_at_fpr(scores, 0.05)
    assert t == 95.0  # s_(n−m) with m = 5: 96…100 are flagged
    assert flag_rate(scores, t) == 0.05


def test_threshold_with_ties_stays_below_target() -> None:
    # Variation-ratio-like discrete scores: 90 zeros, 6 at 0.5, 4 at 0.9.
    scores = np.array([0.0] * 90 + [0.5] * 6 + [0.9] * 4)
    t = threshold_at_fpr(scores, 0.05)
    assert t == 0.5  # flagging the 0.5 tie group would flag 10 % > 5 %
    assert flag_rate(scores, t) == pytest.approx(0.04)


def test_threshold_when_nothing_may_be_flagged() -> None:
    scores = np.array([0.3, 0.1, 0.2])
    assert threshold_at_fpr(scores, 0.2) == 0.3  # m = ⌊0.6⌋ = 0: threshold = max
    assert flag_rate(scores, 0.3) == 0.0


def test_threshold_survives_round_off_in_target_times_n() -> None:
    scores = np.arange(100.0)
    t = threshold_at_fpr(scores, 0.29)  # 0.29·100 = 28.999… in floating point
    assert flag_rate(scores, t) == 0.29


def test_threshold_all_flagged_at_rate_one() -> None:
    scores = np.array([2.0, 2.0, 5.0])
    assert flag_rate(scores, threshold_at_fpr(scores, 1.0)) == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_threshold_is_the_most_permissive_one_within_target(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=rng.integers(5, 60)).astype(np.float64)
    for target in (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9):
        t = threshold_at_fpr(scores, target)
        allowed = [c for c in _candidate_thresholds(scores) if flag_rate(scores, c) <= target]
        best = max(flag_rate(scores, c) for c in allowed)
        assert flag_rate(scores, t) <= target
        assert flag_rate(scores, t) == best


# --- AUROC -------------------------------------------------------------------------------------


def test_auroc_hand_values() -> None:
    assert auroc([0.0, 1.0], [2.0, 3.0]) == 1.0
    assert auroc([2.0, 3.0], [0.0, 1.0]) == 0.0
    assert auroc([1.0, 1.0], [1.0]) == 0.5
    # pairs (pos, neg): (1,0)>, (1,1)=, (1,2)<, (2,0)>, (2,1)>, (2,2)= → (3 + 2·½)/6
    assert auroc([0.0, 1.0, 2.0], [1.0, 2.0]) == pytest.approx(4 / 6)


@pytest.mark.parametrize("seed", range(8))
def test_auroc_matches_pairwise_count_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    neg = rng.integers(0, 8, size=rng.integers(1, 80)).astype(np.float32)
    pos = (rng.integers(0, 8, size=rng.integers(1, 80)) + rng.integers(0, 3)).astype(np.float32)
    assert auroc(neg, pos) == pytest.approx(_brute_auroc(neg, pos), abs=1e-12)


def test_auroc_continuous_scores() -> None:
    rng = np.random.default_rng(11)
    neg, pos = rng.normal(0, 1, 300), rng.normal(1, 1, 200)
    assert auroc(neg, pos) == pytest.approx(_brute_auroc(neg, pos), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_roc_curve_area_is_auroc(seed: int) -> None:
    rng = np.random.default_rng(seed)
    neg = rng.integers(0, 5, size=50).astype(np.float64)
    pos = rng.integers(1, 7, size=40).astype(np.float64)
    fpr, tpr, thresholds = roc_curve(neg, pos)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(_brute_auroc(neg, pos), abs=1e-12)
    for f, t, th in zip(fpr, tpr, thresholds, strict=True):  # each point is its threshold's rates
        assert (f, t) == (flag_rate(neg, th), flag_rate(pos, th))


# --- operating points --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_tpr_at_fpr_and_fpr_at_tpr_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    neg = rng.integers(0, 10, size=rng.integers(5, 70)).astype(np.float64)
    pos = rng.integers(2, 12, size=rng.integers(5, 70)).astype(np.float64)
    candidates = _candidate_thresholds(neg, pos)
    for fpr in (0.0, 0.05, 0.2):
        best = max(flag_rate(pos, c) for c in candidates if flag_rate(neg, c) <= fpr)
        assert tpr_at_fpr(neg, pos, fpr) == best
    for tpr in (0.5, 0.95, 1.0):
        best = min(flag_rate(neg, c) for c in candidates if flag_rate(pos, c) >= tpr - 1e-12)
        assert fpr_at_tpr(neg, pos, tpr) == best


def test_detection_metrics_fields_and_no_positives() -> None:
    neg = np.arange(20.0)
    m = detection_metrics(neg, np.array([30.0, 31.0]), threshold=18.0)
    assert m["auroc"] == 1.0 and m["tpr_at_5fpr"] == 1.0 and m["fpr_at_95tpr"] == 0.0
    assert m["tpr_at_threshold"] == 1.0 and m["fpr_at_threshold"] == 0.05
    empty = detection_metrics(neg, np.array([]), threshold=18.0)
    assert empty["auroc"] is None and empty["tpr_at_threshold"] is None
    assert empty["n_adversarial"] == 0 and empty["fpr_at_threshold"] == 0.05


@pytest.mark.parametrize(
    ("neg", "match"),
    [([], "no clean"), ([[1.0, 2.0]], "1-D"), ([1.0, float("nan")], "NaN")],
)
def test_bad_scores_are_rejected(neg: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        threshold_at_fpr(neg, 0.05)


def test_bad_rate_is_rejected() -> None:
    with pytest.raises(ValueError, match="target false-positive rate"):
        threshold_at_fpr([1.0, 2.0], 1.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detection_metrics_report_the_5_and_95_percent_levels(seed: int) -> None:
    """The headline fields against brute force on overlapping scores (where every level gives a
    different answer): ``tpr_at_5fpr`` = the best TPR of any threshold ``t`` (flag ``s > t``) whose
    clean FPR is ≤ 5 %; ``fpr_at_95tpr`` = the least FPR of any threshold flagging ≥ 95 %."""
    rng = np.random.default_rng(seed)
    neg, pos = rng.normal(0, 1, 400), rng.normal(1.2, 1, 300)
    cuts = np.concatenate([[-np.inf], np.sort(np.concatenate([neg, pos])) - 1e-9, [np.inf]])
    fpr = np.array([(neg > t).mean() for t in cuts])
    tpr = np.array([(pos > t).mean() for t in cuts])
    out = detection_metrics(neg, pos)
    assert out["tpr_at_5fpr"] == pytest.approx(tpr[fpr <= 0.05].max())
    assert out["fpr_at_95tpr"] == pytest.approx(fpr[tpr >= 0.95].min())
    # and the levels are not interchangeable here: 10 % / 50 % would give other numbers
    assert tpr[fpr <= 0.10].max() != tpr[fpr <= 0.05].max()
    assert fpr[tpr >= 0.50].min() != fpr[tpr >= 0.95].min()


def test_fpr_at_tpr_zero_is_zero() -> None:
    """A TPR of 0 is met by flagging nothing (a threshold above every score): FPR 0, even when
    clean scores lie above every adversarial one."""
    assert fpr_at_tpr([5.0, 6.0, 0.1], [0.2, 0.3], 0.0) == 0.0
    assert fpr_at_tpr([5.0, 6.0, 0.1], [0.2, 0.3], 0.5) == pytest.approx(2 / 3)
