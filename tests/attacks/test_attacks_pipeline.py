"""The clean → attack → record pipeline against float64 hand references on the linear net, with
extra per-example scores, and the same numbers whether ``calibrate`` or the sweep runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from attacks_testnets import LinearNet

from bayesgate.attacks.calibrate import calibrate
from bayesgate.attacks.methods import CWL2, FGS, TargetedFGS
from bayesgate.attacks.pipeline import detection_run, scores_from_probs
from bayesgate.attacks.sweep import detection
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.store.directory import load_model


def _softmax64(net: LinearNet, x: torch.Tensor) -> np.ndarray:
    w = net.head.weight.detach().double().numpy()
    b = net.head.bias.detach().double().numpy()
    logits = x.flatten(1).double().numpy() @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def _entropy64(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.clip(p, 1e-300, None))).sum(1)


def _pairwise_auroc(neg: np.ndarray, pos: np.ndarray) -> float:
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0) + 0.5 * (diff == 0)).mean())


def _data(net: LinearNet, n: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(9))
    y = net(x).argmax(1)
    y[::4] = (y[::4] + 1) % 3  # some clean images misclassified
    return x, y


def _brightness(x: torch.Tensor, probs: torch.Tensor) -> dict[str, np.ndarray]:
    """The uncertainty scores plus an extra per-example score computed from the images."""
    return {**scores_from_probs(probs), "brightness": x.flatten(1).double().mean(1).numpy()}


def test_pipeline_matches_hand_references_on_the_linear_net(linear_net: LinearNet) -> None:
    x, y = _data(linear_net)
    attacks = [FGS(eta=0.15), TargetedFGS(eta=0.05, steps=8, target=2), CWL2(iterations=5)]
    run = detection_run(linear_net, x, y, attacks, k_attack=1, k_eval=1, slow_limit=7)
    p_clean = _softmax64(linear_net, x)
    np.testing.assert_array_equal(run.clean.pred.numpy(), p_clean.argmax(1))
    np.testing.assert_allclose(
        run.clean.scores["predictive_entropy"], _entropy64(p_clean), rtol=1e-5, atol=1e-6
    )
    assert [r.attack for r in run.results] == attacks
    for result in run.results:
        n = 7 if result.attack.slow else x.shape[0]  # only the slow attack (CW) is limited
        x_adv, rec = result.outcome.x_adv, result.record
        assert x_adv.shape[0] == rec["images"] == n
        adv_pred = _softmax64(linear_net, x_adv).argmax(1)
        correct = p_clean.argmax(1)[:n] == y[:n].numpy()
        if result.attack.targeted:
            success = correct & (y[:n].numpy() != 2) & (adv_pred == 2)
        else:
            success = correct & (adv_pred != y[:n].numpy())
        assert rec["successful"] == int(success.sum())
        adv_h = _entropy64(_softmax64(linear_net, x_adv))[success]
        np.testing.assert_allclose(result.scores["predictive_entropy"], adv_h, rtol=1e-5, atol=1e-6)
        h = rec["scores"]["predictive_entropy"]
        assert h["n_clean"] == x.shape[0] and h["n_adversarial"] == int(success.sum())
        if success.any():
            ref = _pairwise_auroc(run.clean.scores["predictive_entropy"], adv_h)
            assert rec["auroc"] == pytest.approx(ref, abs=2e-6)  # records round to 6 places


def test_extra_scores_are_recorded_like_the_uncertainty_ones(linear_net: LinearNet) -> None:
    x, y = _data(linear_net)
    thresholds = {"predictive_entropy": 0.5, "mutual_information": 0.0, "variation_ratio": 0.0}
    thresholds["brightness"] = 0.5
    run = detection_run(
        linear_net,
        x,
        y,
        [FGS(eta=0.3)],
        k_attack=1,
        k_eval=1,
        thresholds=thresholds,
        score="brightness",
        score_fn=_brightness,
    )
    clean_b = x.flatten(1).double().mean(1).numpy()
    np.testing.assert_allclose(run.clean.scores["brightness"], clean_b)
    (result,) = run.results
    success = result.outcome.success.numpy()
    adv_b = result.outcome.x_adv.flatten(1).double().mean(1).numpy()[success]
    assert success.sum() > 0
    np.testing.assert_allclose(result.scores["brightness"], adv_b)
    rec = result.record
    assert rec["score"] == "brightness" and set(rec["scores"]) == set(thresholds)
    assert rec["auroc"] == pytest.approx(_pairwise_auroc(clean_b, adv_b), abs=1e-6)
    assert rec["tpr_at_threshold"] == pytest.approx(float((adv_b > 0.5).mean()), abs=1e-6)
    assert rec["fpr_at_threshold"] == pytest.approx(float((clean_b > 0.5).mean()), abs=1e-6)


def test_calibrate_and_the_detection_sweep_give_the_same_numbers(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir)
    attacks = ["fgs:eta=0.3", "targeted:steps=3,eta=0.05"]
    cal = calibrate(
        loaded, k=6, k_attack=3, attacks=attacks, val_limit=100, test_limit=40, seed=2
    ).calibration
    x, y = load_mnist("test", limit=40)
    rows = detection([loaded], x, y, attacks=attacks, k=3, k_eval=6, seed=2)
    assert len(rows) == 3 * len(attacks)
    for record in cal.attacks:
        for score, metrics in record["scores"].items():
            (row,) = [
                r for r in rows if r["attack_key"] == record["attack"] and r["score"] == score
            ]
            assert row["successful"] == record["successful"] and row["eligible"] > 0
            for key in ("auroc", "tpr_at_5fpr", "fpr_at_95tpr", "mean_adversarial"):
                assert row[key] == metrics[key]
