"""``bayesgate fit-detector`` on a tiny trained model and a data subset."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesgate.attacks.metrics import flag_rate, threshold_at_fpr
from bayesgate.cli import main
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import FUSED, load_detector, score_images
from bayesgate.models.detection.store import DETECTOR_JSON
from bayesgate.models.store.calibration import Calibration, read_calibration, write_calibration
from bayesgate.models.store.directory import load_model

FIT = ["--train-subset", "600", "--fit-images", "200", "--threshold-images", "200"]
SMALL = ["--attack-images", "40", "--kde-per-class", "20", "--k", "5", "--threads", "1"]
ATTACKS = ["--attacks", "fgs:eta=0.2", "targeted:steps=3,eta=0.05", "--no-progress"]


def test_fit_detector_on_an_uncalibrated_model_says_calibrate_comes_next(
    model_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    (model_copy / "calibration.json").unlink(missing_ok=True)
    assert main(["fit-detector", str(model_copy), *FIT, *SMALL, *ATTACKS]) == 0
    out, err = capsys.readouterr()
    assert not json.loads(out)["calibration_references_it"]
    assert err.strip() == (
        f"fit-detector: note: {model_copy} has no calibration.json yet; serve, predict and "
        f"Gate.load need one: run `bayesgate calibrate {model_copy}` (the flag then stays with "
        "this detector)"
    )


def test_fit_detector_end_to_end(model_copy: Path, capsys: pytest.CaptureFixture) -> None:
    loaded = load_model(model_copy)
    sha = loaded.card.weights_sha256
    write_calibration(Calibration(sha, "predictive_entropy", 0.05, 5, {"predictive_entropy": 1.0}),
                      model_copy)  # fmt: skip
    assert main(["fit-detector", str(model_copy), *FIT, *SMALL, *ATTACKS]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["calibration_references_it"] and summary["score"] == FUSED
    assert "no calibration.json" not in err

    detector = load_detector(model_copy, weights_sha256=sha)
    reference = read_calibration(model_copy, weights_sha256=sha).detector
    assert reference == {
        "file": DETECTOR_JSON,
        "sha256": hashlib.sha256((model_copy / DETECTOR_JSON).read_bytes()).hexdigest(),
    }
    assert detector.k == 5 and set(detector.gaussians) == {"penultimate"}  # an MLP
    assert detector.kde is not None and detector.kde.samples.shape == (200, 32)  # 20 per class
    fit = detector.fit
    assert fit["images"] == {"train": 600, "fit": 200, "attacked": 40, "threshold": 200}
    grid = [s for s, _ in fit["kde"]["grid"]]
    assert grid[0] < detector.kde.bandwidth < grid[-1]
    assert set(fit["attacks"]) == {"fgs:eta=0.2", "targeted:eta=0.05,steps=3,target=random"}

    # The thresholds are the 95 % points of the scores of the *other* validation images (the
    # threshold part, after the seeded shuffle), recomputed here from scratch.
    x_val, _ = load_mnist("val")
    order = torch.randperm(10_000, generator=torch.Generator().manual_seed(0))
    held_out = x_val[order[200:400]]
    scores = score_images(detector, loaded.network, held_out, k=5, seed=0, batch_size=500)
    assert set(scores) == set(detector.thresholds) == set(detector.score_names)
    for name, values in scores.items():
        t = threshold_at_fpr(values, 0.05)
        if name == FUSED:  # min-p: the midpoint before the next attainable value
            assert detector.conformal is not None
            assert detector.thresholds[name] == detector.conformal.gap_threshold(t) > t
            assert flag_rate(values, detector.thresholds[name]) == flag_rate(values, t)
        else:
            assert detector.thresholds[name] == t
        assert fit["realised_fpr"][name] <= 0.05

    # re-calibrating keeps serving the fitted detector
    small = ["--val-limit", "50", "--test-limit", "50", "--k", "5", "--attacks", "fgs:eta=0.2"]
    assert main(["calibrate", str(model_copy), *small, "--no-report", "--no-progress"]) == 0
    assert read_calibration(model_copy, weights_sha256=sha).detector == reference


def test_fit_detector_thresholds_follow_the_target_fpr(tiny_model_dir: Path) -> None:
    """``target_fpr = 0.2``: every threshold flags at most 20 % of the threshold part's clean
    images — rescored here from scratch and counted by hand — and each score whose 200 values
    are distinct is flagged at exactly 40 of 200 (a threshold at 0.05 would flag at most 10), so
    the fit's own target is used, not the default 0.05; the report's realised FPRs agree."""
    from bayesgate.attacks.detector_fit import FitSettings, fit_detector

    loaded = load_model(tiny_model_dir)
    settings = FitSettings(k=5, train_subset=600, fit_images=200, threshold_images=200,
                           attack_images=40, kde_per_class=20, attacks=("fgs:eta=0.2",),
                           target_fpr=0.2)  # fmt: skip
    detector = fit_detector(loaded, settings)
    assert detector.target_fpr == 0.2

    x_val, _ = load_mnist("val")
    order = torch.randperm(10_000, generator=torch.Generator().manual_seed(0))
    scores = score_images(detector, loaded.network, x_val[order[200:400]], k=5, seed=0)
    assert set(scores) == set(detector.thresholds)
    distinct = set()
    for name, values in scores.items():
        flagged = int((values > detector.thresholds[name]).sum())
        assert flagged <= 40, name
        assert detector.fit["realised_fpr"][name] == flagged / 200, name
        if np.unique(values).size == 200:
            distinct.add(name)
            assert flagged == 40, name
    assert {"predictive_entropy", "mutual_information", "fused_logistic"} <= distinct


def test_fit_detector_fits_the_grid_layer_when_asked(
    tiny_cnn_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A CNN with ``--trunk-grid``: ``trunk_2x2`` Gaussians on the training subset, their distance
    a third p-value of the min-p rule with its own threshold, not an input of the logistic fusion;
    the scores served from the stored files are those of the fit."""
    from bayesgate.attacks.detector_fit import GRID_SCORE, MIN_P_SCORES

    model = Path(shutil.copytree(tiny_cnn_dir, tmp_path / "cnn"))
    args = [*FIT, *SMALL, *ATTACKS, "--trunk-grid"]
    assert main(["fit-detector", str(model), *args]) == 0
    assert json.loads(capsys.readouterr().out)["rule"]["names"] == [*MIN_P_SCORES, GRID_SCORE]
    loaded = load_model(model)
    detector = load_detector(model, weights_sha256=loaded.card.weights_sha256)
    assert set(detector.gaussians) == {"trunk", "trunk_2x2", "penultimate"}
    assert detector.gaussians["trunk_2x2"].means.shape == (10, 4 * 32)
    assert detector.fusion is not None and GRID_SCORE not in detector.fusion.names
    assert GRID_SCORE in detector.thresholds and 0 < detector.fit["shrinkage"]["trunk_2x2"] < 1
    x_val, _ = load_mnist("val", limit=20)
    scores = score_images(detector, loaded.network, x_val, k=5, seed=0)
    assert set(scores) == set(detector.score_names) and np.all(scores[GRID_SCORE] > 0)


def test_fit_detector_rejects_bad_settings(model_copy: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["fit-detector", str(model_copy), "--fit-images", "0", "--no-progress"]) == 2
    assert "fit-images must be ≥ 1" in capsys.readouterr().err
    args = ["--fit-images", "6000", "--threshold-images", "5000", "--no-progress"]
    assert main(["fit-detector", str(model_copy), *args]) == 2
    assert "validation split has 10000 images" in capsys.readouterr().err
    assert main(["fit-detector", str(model_copy / "nope"), "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("bayesgate: error:")
    assert main(["fit-detector", str(model_copy), "--trunk-grid", "--no-progress"]) == 2
    assert "no trunk_2x2 features" in capsys.readouterr().err  # an MLP has no conv maps


def test_fit_detector_adds_synthetic_outliers_to_the_fusion(
    model_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    """``--outliers``: one outlier per attacked fit image and kind, scored with the fit's K and
    seed; the logistic fusion is the three-group fit of exactly those scores (recomputed here
    from the images), and the report gives each kind's count and AUROCs."""
    from bayesgate.attacks.detector_fit import FitSettings, _FitRun
    from bayesgate.attacks.outliers import outlier_images
    from bayesgate.models.detection.detector import collect_features, scores_numpy
    from bayesgate.models.detection.fusion import fit_fusion

    args = [*FIT, *SMALL, *ATTACKS, "--outliers", "chimera", "patches", "--outlier-share", "0.4"]
    assert main(["fit-detector", str(model_copy), *args]) == 0
    capsys.readouterr()
    loaded = load_model(model_copy)
    detector = load_detector(model_copy, weights_sha256=loaded.card.weights_sha256)
    fit = detector.fit
    assert fit["settings"]["outliers"] == ["chimera", "patches"]
    assert fit["settings"]["outlier_share"] == 0.4
    assert {k: v["images"] for k, v in fit["outliers"].items()} == {"chimera": 40, "patches": 40}
    assert 0.0 <= fit["outliers"]["patches"]["auroc"][FUSED] <= 1.0

    # the same detector's fusion, refitted here from the parts it was made of
    x_val, y_val = load_mnist("val")
    order = torch.randperm(10_000, generator=torch.Generator().manual_seed(0))
    fit_rows = order[:200]
    x_fit, y_fit = x_val[fit_rows][:40], y_val[fit_rows][:40]
    names = detector.fusion.names

    def scores(x: torch.Tensor) -> dict[str, np.ndarray]:
        probs, feats = collect_features(loaded.network, x, 5, batch_size=500, seed=0)
        return scores_numpy(detector, probs, feats)

    parts = [scores(outlier_images(kind, x_fit, y_fit, seed=0)) for kind in ("chimera", "patches")]
    outliers = {n: np.concatenate([p[n] for p in parts]) for n in names}
    clean = {n: v for n, v in scores(x_val[fit_rows]).items() if n in names}
    run = _FitRun(loaded, FitSettings(k=5, attacks=tuple(ATTACKS[1:3])), torch.device("cpu"), False)
    adversarial, _ = run.adversarial_scores(detector, x_fit, y_fit)
    attacks = {n: np.concatenate([a[n] for a in adversarial.values()]) for n in names}
    transforms, l2 = detector.fusion.transforms, detector.fusion.l2
    refit = fit_fusion(clean, attacks, names, transforms, l2, outliers=outliers, outlier_share=0.4)
    np.testing.assert_allclose(refit.coef, detector.fusion.coef, rtol=1e-6, atol=1e-9)
    assert refit.intercept == pytest.approx(detector.fusion.intercept, rel=1e-6, abs=1e-9)
    plain = fit_fusion(clean, attacks, names, transforms, l2)  # the outliers did move the fit
    assert not np.allclose(plain.coef, detector.fusion.coef, rtol=1e-2)

    settings = ["--outliers", "rotated", "--no-progress"]
    assert main(["fit-detector", str(model_copy), *settings]) == 2
    assert "unknown outlier kind(s) rotated" in capsys.readouterr().err
    settings = ["--outliers", "chimera", "--outlier-share", "1", "--no-progress"]
    assert main(["fit-detector", str(model_copy), *settings]) == 2
    assert "outlier-share must be in (0, 1)" in capsys.readouterr().err
