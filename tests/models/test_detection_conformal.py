"""The min-p-value fusion (:mod:`bayesgate.models.detection.conformal`) against direct counts."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.models.detection import (
    FUSED,
    FUSED_LOGISTIC,
    Detector,
    load_detector,
    save_detector,
)
from bayesgate.models.detection.conformal import ConformalFusion, fit_conformal
from bayesgate.models.detection.fusion import LogisticFusion
from bayesgate.models.detection.mahalanobis import ClassGaussians

NAMES = ("a", "b", "c")


def _clean(n: int, seed: int) -> dict[str, np.ndarray]:
    """Three correlated clean scores, one heavy-tailed, one with many ties."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 2))
    return {"a": z[:, 0], "b": np.exp(z[:, 0] + z[:, 1]), "c": np.round(z[:, 1], 1)}


def _torch(scores: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {n: torch.from_numpy(v) for n, v in scores.items()}


def test_p_values_are_the_direct_count() -> None:
    ref = _clean(300, 0)
    rule = fit_conformal(ref, NAMES)
    x = _clean(200, 1)
    x["c"][:20] = ref["c"][:20]  # exact ties with reference values
    p = rule.p_values(_torch(x)).numpy()
    for j, name in enumerate(NAMES):
        stored = np.array(rule.reference[j])
        for i in range(200):
            count = sum(1 for r in stored if r >= x[name][i])
            assert p[i, j] == (1 + count) / (len(stored) + 1)
    fused = rule.score(_torch(x)).numpy()
    # two libraries' float64 log: within an ulp or two, not always the same bits (numpy 1.26's
    # AVX-512 log differed from torch's by one ulp on 47 of these 200 values, 2026-11-29)
    np.testing.assert_allclose(fused, -np.log(p.min(axis=1)), rtol=1e-15, atol=0)


def test_reference_is_rounded_and_sorted_and_round_trips_json() -> None:
    ref = _clean(50, 2)
    rule = fit_conformal(ref, NAMES, digits=7)
    for j, name in enumerate(NAMES):
        assert list(rule.reference[j]) == sorted(rule.reference[j])
        np.testing.assert_allclose(sorted(ref[name]), rule.reference[j], rtol=1e-6, atol=1e-12)
    assert ConformalFusion.from_json(rule.to_json()) == rule


def test_threshold_keeps_its_fpr_on_held_out_clean_scores() -> None:
    """Reference and threshold on disjoint clean sets; the held-out FPR is within 4 binomial σ
    of the target (σ from the threshold set's and the held-out set's sizes)."""
    rule = fit_conformal(_clean(2000, 3), NAMES)
    threshold = threshold_at_fpr(rule.score(_torch(_clean(2000, 4))).numpy(), 0.05)
    held_out = rule.score(_torch(_clean(20000, 5))).numpy()
    sigma = math.sqrt(0.05 * 0.95 * (1 / 2000 + 1 / 20000))
    assert abs(flag_rate(held_out, threshold) - 0.05) < 4 * sigma


def test_gap_threshold_flags_the_same_inputs_in_float32_and_float64() -> None:
    rule = fit_conformal(_clean(1000, 12), NAMES)
    held_out = _clean(3000, 13)
    exact = rule.score(_torch(held_out)).numpy()
    t = threshold_at_fpr(exact, 0.05)
    gap = rule.gap_threshold(t)
    assert t < gap and not np.any((exact > t) & (exact <= gap))  # no score in between
    single = rule.score({n: torch.from_numpy(v).float() for n, v in held_out.items()}).numpy()
    np.testing.assert_array_equal(single > gap, exact > t)
    # a threshold taken from float32 scores (the level's rounding) gives the same midpoint
    t32 = threshold_at_fpr(single.astype(np.float64), 0.05)
    assert t32 != t and rule.gap_threshold(t32) == gap
    levels = rule.levels()
    assert np.all(np.isin(np.round(exact, 12), np.round(levels, 12)))


def test_fused_score_is_monotone_in_every_score() -> None:
    rule = fit_conformal(_clean(500, 6), NAMES)
    x = _clean(300, 7)
    base = rule.score(_torch(x))
    rng = np.random.default_rng(8)
    for name in NAMES:
        bumped = dict(x)
        bumped[name] = x[name] + rng.exponential(1.0, size=300)
        assert torch.all(rule.score(_torch(bumped)) >= base)
        lowered = dict(x)
        lowered[name] = x[name] - rng.exponential(1.0, size=300)
        assert torch.all(rule.score(_torch(lowered)) <= base)


def test_one_extreme_score_is_enough_to_flag() -> None:
    """The minimum forgets no score: one score beyond every clean reference value gives the
    largest fused score log(n + 1), whatever the others are."""
    rule = fit_conformal(_clean(400, 9), NAMES)
    x = _clean(10, 10)
    x["c"] = np.full(10, 100.0)
    np.testing.assert_allclose(rule.score(_torch(x)).numpy(), math.log(401.0), rtol=1e-12)


def test_smooth_surrogate_matches_at_the_knots_and_has_a_gradient() -> None:
    rng = np.random.default_rng(11)
    ref = {n: rng.standard_normal(200) for n in NAMES}  # continuous: no ties
    rule = fit_conformal(ref, NAMES, digits=17)
    # at a reference value r_(i), interpolated −log p equals the exact −log p
    knots = {n: torch.tensor(rule.reference[j][5:-5], dtype=torch.float64) for j, n in
             enumerate(NAMES)}  # fmt: skip
    exact = -torch.log(rule.p_values(knots))
    for j in range(len(NAMES)):
        interp = rule._smooth_neg_log_p(j, knots[NAMES[j]])
        torch.testing.assert_close(interp, exact[:, j], rtol=0, atol=1e-12)
    # the logsumexp is within [max, max + τ log F] of the exact maximum at the knots
    tau = 0.1
    smooth = rule.smooth(knots, tau)
    top = exact.amax(dim=1)
    assert torch.all(smooth >= top - 1e-12) and torch.all(smooth <= top + tau * math.log(3) + 1e-12)
    x = {n: torch.randn(20, dtype=torch.float64, requires_grad=True) for n in NAMES}
    grads = torch.autograd.grad(rule.smooth(x).sum(), list(x.values()))
    assert all(torch.all(g >= 0) for g in grads)  # monotone
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_smooth_surrogate_continues_the_end_segments_beyond_the_reference() -> None:
    """Outside ``[r_(1), r_(n)]`` (where an attack starts: a clean digit sits below most of the
    reference, an adversarial one above it all) ``−log p`` continues the first and last segments
    linearly, with the knots ``p(r_(i)) = (n − i + 2)/(n + 1)`` (1-based) written out here."""
    rng = np.random.default_rng(12)
    rule = fit_conformal({n: rng.standard_normal(50) for n in NAMES}, NAMES, digits=17)
    for j in range(len(NAMES)):
        r = np.sort(np.asarray(rule.reference[j], dtype=np.float64))
        n = r.size
        y = -np.log((n - np.arange(1, n + 1) + 2) / (n + 1))  # y[0] = 0 at r_(1)
        below = np.array([r[0] - 2.0, r[0] - 0.1])
        above = np.array([r[-1] + 0.1, r[-1] + 3.0])
        first = y[0] + (y[1] - y[0]) / (r[1] - r[0]) * (below - r[0])
        last = y[-2] + (y[-1] - y[-2]) / (r[-1] - r[-2]) * (above - r[-2])
        got = rule._smooth_neg_log_p(j, torch.tensor(np.concatenate([below, above])))
        np.testing.assert_allclose(got.numpy(), np.concatenate([first, last]), rtol=1e-12)


def test_detector_serves_the_rule_and_round_trips(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    gaussians = {"trunk": ClassGaussians(torch.randn(3, 4, generator=g), torch.eye(4), 0.1)}
    fusion = LogisticFusion(
        ("predictive_entropy", "mahalanobis_trunk"), ("identity", "log1p"), (0.1, 2.0),
        (0.3, 0.7), (1.5, 0.3), 0.25, 1e-3,
    )  # fmt: skip
    det = Detector("ab" * 32, 7, gaussians, fusion=fusion, thresholds={FUSED: 1.0})
    probs = torch.softmax(torch.randn(50, 7, 3, generator=g) * 3, dim=-1)
    features = {"trunk": torch.randn(50, 4, generator=g)}
    before = det.scores(probs, features)
    names = ("predictive_entropy", FUSED_LOGISTIC)
    logit = before[FUSED]
    det.conformal = fit_conformal(
        {"predictive_entropy": before["predictive_entropy"].numpy(), FUSED_LOGISTIC: logit.numpy()},
        names,
    )
    after = det.scores(probs, features)
    assert torch.equal(after[FUSED_LOGISTIC], logit)
    p = det.conformal.p_values(
        {"predictive_entropy": before["predictive_entropy"], FUSED_LOGISTIC: logit}
    )
    torch.testing.assert_close(after[FUSED], -torch.log(p.amin(dim=1)), rtol=0, atol=0)
    assert FUSED_LOGISTIC in det.score_names
    save_detector(det, tmp_path)
    back = load_detector(tmp_path, weights_sha256="ab" * 32)
    assert back.conformal == det.conformal
    again = back.scores(probs, features)
    assert all(torch.equal(again[n], after[n]) for n in after)


def test_fisher_rule_is_the_sum_of_minus_log_p_and_round_trips() -> None:
    """``combine="fisher"``: ``−Σ_j log p_j`` of the directly counted p-values; its surrogate is
    the sum of the interpolated ``−log p_j`` (exact at the knots, monotone); JSON keeps the rule."""
    ref = _clean(300, 12)
    rule = fit_conformal(ref, NAMES, combine="fisher")
    x = _clean(100, 13)
    p = np.empty((100, len(NAMES)))
    for j, name in enumerate(NAMES):
        stored = np.array(rule.reference[j])
        p[:, j] = [(1 + np.sum(stored >= v)) / (stored.size + 1) for v in x[name]]
    fused = rule.score(_torch(x)).numpy()
    np.testing.assert_allclose(fused, -np.log(p).sum(axis=1), rtol=1e-12, atol=1e-12)
    # two moderately unusual scores outweigh one: the sum, not the minimum
    two = {n: torch.tensor([np.quantile(ref[n], 0.9)] * 2) for n in NAMES}
    two["c"] = torch.tensor([np.quantile(ref["c"], 0.1), np.quantile(ref["c"], 0.1)])
    one = {n: torch.tensor([np.quantile(ref[n], 0.1)] * 2) for n in NAMES}
    one["a"] = torch.tensor([np.quantile(ref["a"], 0.95)] * 2)
    assert torch.all(rule.score(two) > rule.score(one))
    assert fit_conformal(ref, NAMES).score(two)[0] < fit_conformal(ref, NAMES).score(one)[0]

    smooth_ref = {n: np.random.default_rng(14).standard_normal(200) for n in NAMES}
    smooth_rule = fit_conformal(smooth_ref, NAMES, digits=17, combine="fisher")
    knots = {n: torch.tensor(smooth_rule.reference[j][5:-5], dtype=torch.float64)
             for j, n in enumerate(NAMES)}  # fmt: skip
    exact = -torch.log(smooth_rule.p_values(knots)).sum(dim=1)
    torch.testing.assert_close(smooth_rule.smooth(knots), exact, rtol=0, atol=1e-12)
    assert smooth_rule.gap_threshold(3.25) == 3.25

    back = ConformalFusion.from_json(rule.to_json())
    assert back == rule and back.combine == "fisher" and rule.to_json()["rule"] == "fisher_p_value"
    assert ConformalFusion.from_json(fit_conformal(ref, NAMES).to_json()).combine == "min"
    with np.testing.assert_raises(ValueError):
        ConformalFusion.from_json({**rule.to_json(), "rule": "mean_p_value"})
    with np.testing.assert_raises(ValueError):
        fit_conformal(ref, NAMES, combine="stouffer")
