"""detector.safetensors + detector.json: bit-exact round trip, integrity checks, the scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bayesgate.models.detection import FUSED, KDE_SCORE, Detector, load_detector, save_detector
from bayesgate.models.detection.fusion import LogisticFusion
from bayesgate.models.detection.kde import ClassKDE
from bayesgate.models.detection.mahalanobis import ClassGaussians
from bayesgate.models.detection.store import DETECTOR_JSON, DETECTOR_TENSORS
from bayesgate.models.mc.uncertainty import predictive_entropy
from bayesgate.models.store.directory import ModelStoreError

SHA = "ab" * 32


def _detector(kde_dtype: torch.dtype = torch.float16) -> Detector:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(6, 6, generator=g, dtype=torch.float64)
    gaussians = {
        "trunk": ClassGaussians(torch.randn(3, 4, generator=g), torch.eye(4) * 0.7, 0.125),
        "penultimate": ClassGaussians(
            torch.randn(3, 6, generator=g), (a @ a.T + torch.eye(6)).inverse().float(), 1 / 3
        ),
    }
    kde = ClassKDE(
        torch.randn(9, 6, generator=g).to(kde_dtype), torch.tensor([0, 2, 5, 9]), 1.2345678901234
    )
    names = ("predictive_entropy", "mahalanobis_trunk", KDE_SCORE)
    fusion = LogisticFusion(
        names, ("identity", "log1p", "log1p"), (0.1, 2.0, 3.0), (0.3, 0.7, 1.1),
        (1.5, 0.1 + 0.2, -0.4), 0.123456789, 1e-3,
    )  # fmt: skip
    thresholds = {"predictive_entropy": 0.45, FUSED: 1 / 7}
    return Detector(SHA, 20, gaussians, kde, "penultimate", fusion, 0.05, thresholds, {"x": [1]})


def _inputs(b: int = 5) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(b, 7, 3, generator=g) * 3, dim=-1)
    features = {
        "trunk": torch.randn(b, 4, generator=g),
        "penultimate": torch.randn(b, 6, generator=g),
    }
    return probs, features


def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    det = _detector()
    save_detector(det, tmp_path)
    back = load_detector(tmp_path, weights_sha256=SHA)
    for layer, g in det.gaussians.items():
        assert torch.equal(back.gaussians[layer].means, g.means)
        assert torch.equal(back.gaussians[layer].precision, g.precision)
        assert back.gaussians[layer].shrinkage == g.shrinkage
    assert back.kde is not None and det.kde is not None
    assert back.kde.samples.dtype == torch.float16
    assert torch.equal(back.kde.samples, det.kde.samples)
    assert torch.equal(back.kde.offsets, det.kde.offsets)
    assert back.kde.bandwidth == det.kde.bandwidth
    assert back.fusion == det.fusion  # every float equal, not approximately
    assert back.thresholds == det.thresholds and back.k == det.k and back.fit == det.fit
    probs, features = _inputs()
    a, b = det.scores(probs, features), back.scores(probs, features)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    # saving the loaded detector writes the same bytes
    again = tmp_path / "again"
    again.mkdir()
    save_detector(back, again)
    for name in (DETECTOR_JSON, DETECTOR_TENSORS):
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes()


def test_scores_follow_their_formulas() -> None:
    det = _detector(torch.float32)
    probs, features = _inputs()
    scores = det.scores(probs, features)
    assert set(scores) == set(det.score_names)
    predicted = probs.mean(1).argmax(1)
    diff = features["trunk"].unsqueeze(1) - det.gaussians["trunk"].means
    d = 0.7 * (diff**2).sum(-1)  # precision 0.7·I
    torch.testing.assert_close(scores["mahalanobis_trunk"], d.min(1).values)
    torch.testing.assert_close(scores["mahalanobis_trunk_predicted"], d[range(5), predicted])
    torch.testing.assert_close(scores["predictive_entropy"], predictive_entropy(probs))
    assert det.kde is not None and det.fusion is not None
    for b in range(5):
        c = int(predicted[b])
        s = det.kde.class_samples(c)
        kd = torch.exp(-((features["penultimate"][b] - s) ** 2).sum(1) / det.kde.bandwidth**2)
        assert float(scores[KDE_SCORE][b]) == pytest.approx(-float(kd.mean().log()), rel=1e-5)
    z = [
        (scores["predictive_entropy"] - 0.1) / 0.3,
        (torch.log1p(scores["mahalanobis_trunk"]) - 2.0) / 0.7,
        (torch.log1p(scores[KDE_SCORE]) - 3.0) / 1.1,
    ]
    expected = 1.5 * z[0] + (0.1 + 0.2) * z[1] - 0.4 * z[2] + 0.123456789
    torch.testing.assert_close(scores[FUSED], expected)
    flags = det.flags(scores)
    assert set(flags) == {"predictive_entropy", FUSED}
    assert torch.equal(flags[FUSED], scores[FUSED] > 1 / 7)
    assert det.score == FUSED and det.threshold == 1 / 7


def test_tampered_or_foreign_files_are_refused(tmp_path: Path) -> None:
    save_detector(_detector(), tmp_path)
    with pytest.raises(ModelStoreError, match="fitted for weights"):
        load_detector(tmp_path, weights_sha256="cd" * 32)
    blob = bytearray((tmp_path / DETECTOR_TENSORS).read_bytes())
    blob[-1] ^= 1
    (tmp_path / DETECTOR_TENSORS).write_bytes(bytes(blob))
    with pytest.raises(ModelStoreError, match="sha256"):
        load_detector(tmp_path)
    meta = json.loads((tmp_path / DETECTOR_JSON).read_text())
    meta["format"] = "something-else"
    (tmp_path / DETECTOR_JSON).write_text(json.dumps(meta))
    with pytest.raises(ModelStoreError, match="not a bayesgate-detector/1"):
        load_detector(tmp_path)
    with pytest.raises(ModelStoreError, match="fit-detector"):
        load_detector(tmp_path / "missing")


def test_scores_are_differentiable_in_the_features() -> None:
    """An adaptive attack differentiates the fused score: autograd matches finite differences
    (float64), with rows of several predicted classes in one batch."""
    det = _detector(torch.float32)
    probs, features = _inputs(6)
    assert det.kde is not None
    classes = torch.tensor([0, 2, 1, 2, 0, 1])
    f = features["penultimate"].double().requires_grad_()
    assert torch.autograd.gradcheck(lambda v: det.kde.log_density(v, classes), (f,))
    g = det.gaussians["trunk"]
    trunk = features["trunk"].double().requires_grad_()
    double = type(g)(g.means.double(), g.precision.double(), g.shrinkage)
    assert torch.autograd.gradcheck(lambda v: double.distances(v), (trunk,))
    leaves = {n: v.clone().requires_grad_() for n, v in features.items()}
    det.scores(probs, leaves)[FUSED].sum().backward()
    assert all(v.grad is not None and torch.isfinite(v.grad).all() for v in leaves.values())


def test_a_grid_layer_and_its_min_p_rule_round_trip_bit_exactly(tmp_path: Path) -> None:
    """A detector with ``trunk_2x2`` Gaussians (``fit-detector --trunk-grid``) and the min-p rule
    over logit, entropy and their distance: same tensors, same bytes, same scores after loading."""
    from bayesgate.attacks.detector_fit import GRID_SCORE, min_p_scores
    from bayesgate.models.detection import FUSED_LOGISTIC
    from bayesgate.models.detection.conformal import fit_conformal

    det = _detector(torch.float32)
    g = torch.Generator().manual_seed(2)
    a = torch.randn(8, 8, generator=g, dtype=torch.float64)
    precision = (a @ a.T + torch.eye(8, dtype=torch.float64)).inverse().float()
    det.gaussians["trunk_2x2"] = ClassGaussians(torch.randn(3, 8, generator=g), precision, 0.01)
    probs, features = _inputs(40)
    features["trunk_2x2"] = torch.randn(40, 8, generator=g)
    clean = {n: v.double().numpy() for n, v in det.scores(probs, features).items()}
    clean[FUSED_LOGISTIC] = clean.pop(FUSED)
    det.conformal = fit_conformal(clean, min_p_scores(det))
    assert det.conformal.names == (FUSED_LOGISTIC, "predictive_entropy", GRID_SCORE)
    save_detector(det, tmp_path)
    back = load_detector(tmp_path, weights_sha256=SHA)
    assert torch.equal(back.gaussians["trunk_2x2"].means, det.gaussians["trunk_2x2"].means)
    assert torch.equal(back.gaussians["trunk_2x2"].precision, precision)
    assert back.conformal == det.conformal
    a_scores, b_scores = det.scores(probs, features), back.scores(probs, features)
    assert GRID_SCORE in a_scores and a_scores.keys() == b_scores.keys()
    assert all(torch.equal(a_scores[n], b_scores[n]) for n in a_scores)
    again = tmp_path / "again"
    again.mkdir()
    save_detector(back, again)
    for name in (DETECTOR_JSON, DETECTOR_TENSORS):
        assert (again / name).read_bytes() == (tmp_path / name).read_bytes()
