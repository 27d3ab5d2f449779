"""A model served with a fused detector: every score in /v1 and /v2, the fused flag, the admin
decision over any score, and start-up checks of the detector files."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bayesgate.attacks.metrics import threshold_at_fpr
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection import FUSED, KDE_SCORE, load_detector, save_detector
from bayesgate.models.detection.detector import Detector, collect_features, scores_numpy
from bayesgate.models.detection.fit import fit_gaussians, fit_kde, fused_score_names, transform_for
from bayesgate.models.detection.fusion import fit_fusion
from bayesgate.models.detection.store import DETECTOR_JSON
from bayesgate.models.mc.engine import mc_predict_features
from bayesgate.models.store.calibration import read_calibration, write_calibration
from bayesgate.models.store.directory import load_model
from bayesgate.service.engine import mc_engine
from bayesgate.service.errors import StartupError
from bayesgate.service.served_model import load_served_model
from bayesgate.service.settings import Settings

pytestmark = pytest.mark.anyio

K = 5
KEY = "0123456789abcdef-admin"
DETECTOR_SCORES = [
    "predictive_entropy",
    "mutual_information",
    "variation_ratio",
    "mahalanobis_penultimate",
    "mahalanobis_penultimate_predicted",
    KDE_SCORE,
    FUSED,
]


@pytest.fixture(scope="module")
def detector_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny service model plus a detector fitted on small subsets (clean validation images vs
    uniform noise for the fusion: a fixture, not a good detector), linked from calibration.json."""
    directory = Path(shutil.copytree(tiny_model_dir, tmp_path_factory.mktemp("det") / "model"))
    loaded = load_model(directory)
    net, sha = loaded.network, loaded.card.weights_sha256
    x_train, y_train = load_mnist("train", limit=600)
    x_val, y_val = load_mnist("val", limit=400)
    _, train_f = collect_features(net, x_train, K)
    val_p, val_f = collect_features(net, x_val, K)
    gaussians = fit_gaussians(train_f, y_train, 10)
    kde, _ = fit_kde(train_f["penultimate"], y_train, val_f["penultimate"], y_val, 10, per_class=20)
    detector = Detector(sha, K, gaussians, kde)
    clean = scores_numpy(detector, val_p, val_f)
    noise = torch.rand(200, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    noisy = scores_numpy(detector, *collect_features(net, noise, K))
    names = fused_score_names(("penultimate",), with_kde=True)
    detector.fusion = fit_fusion(clean, noisy, names, tuple(map(transform_for, names)))
    all_clean = scores_numpy(detector, val_p, val_f)
    detector.thresholds = {n: threshold_at_fpr(s, 0.05) for n, s in all_clean.items()}
    digest = save_detector(detector, directory)
    calibration = read_calibration(directory, weights_sha256=sha)
    calibration.detector = {"file": DETECTOR_JSON, "sha256": digest}
    write_calibration(calibration, directory)
    return directory


def _settings(directory: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"model_dir": directory, "device": "cpu", "max_queue_delay_ms": 2.0}
    return Settings(**{**values, **overrides})


async def test_v1_predictions_carry_every_score_and_the_fused_flag(
    serving: Callable[[Settings], Any], detector_dir: Path
) -> None:
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    x[0] = load_mnist("test", limit=1)[0][0]
    body = {"instances": x.tolist(), "mc_samples": K, "seed": 11}
    async with serving(_settings(detector_dir)) as (_, client):
        response = await client.post("/v1/predict", json=body)
        models = (await client.get("/v1/models")).json()
    assert response.status_code == 200, response.text
    rows = response.json()["predictions"]
    detector = load_detector(detector_dir)
    # the reference: the same seeded K passes through the library, then the detector's scores
    out = mc_predict_features(
        load_model(detector_dir).network, x, K, generator=torch.Generator().manual_seed(11)
    )
    expected = scores_numpy(detector, out.probs, out.features)
    for b, row in enumerate(rows):
        assert list(row["scores"]) == DETECTOR_SCORES
        for name in DETECTOR_SCORES:
            assert row["scores"][name] == pytest.approx(expected[name][b], rel=1e-5, abs=1e-6)
        assert row["score_name"] == FUSED and row["score"] == row["scores"][FUSED]
        assert row["threshold"] == detector.thresholds[FUSED]
        assert row["adversarial"] == (row["score"] > row["threshold"])
        # the fields that existed before are unchanged
        assert row["predictive_entropy"] == row["scores"]["predictive_entropy"]
        assert row["mutual_information"] == row["scores"]["mutual_information"]
    calibration = models["models"][0]["calibration"]
    assert calibration["score"] == FUSED and calibration["detector"]["score"] == FUSED
    assert calibration["thresholds"][KDE_SCORE] == detector.thresholds[KDE_SCORE]


async def test_the_engine_computes_only_the_layers_the_detector_reads(
    serving: Callable[[Settings], Any], detector_dir: Path
) -> None:
    calls: list[tuple[Any, set[str]]] = []

    def recording(network: Any, x: torch.Tensor, k: int, generator: Any, **kw: Any) -> Any:
        out = mc_engine(network, x, k, generator, **kw)
        calls.append((kw.get("features"), set(out.features)))
        return out

    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    async with serving(_settings(detector_dir)) as (app, client):
        app.state.worker.engine = recording
        response = await client.post("/v1/predict", json={"instances": x.tolist(), "seed": 1})
    assert response.status_code == 200, response.text
    layers = load_detector(detector_dir).layers
    assert calls == [(layers, set(layers))]
    assert "input" not in layers  # the tiny CNN's detector reads trunk and penultimate only


async def test_v2_outputs_follow(serving: Callable[[Settings], Any], detector_dir: Path) -> None:
    x = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(6))
    infer = {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 1, 28, 28],
                    "data": x.flatten().tolist()}],
        "parameters": {"mc_samples": K, "seed": 3},
    }  # fmt: skip
    async with serving(_settings(detector_dir)) as (_, client):
        meta = (await client.get("/v2/models/tiny-mlp")).json()
        v2 = (await client.post("/v2/models/tiny-mlp/infer", json=infer)).json()
        picked = await client.post(
            "/v2/models/tiny-mlp/infer", json={**infer, "outputs": [{"name": KDE_SCORE}]}
        )
        v1 = (await client.post("/v1/predict", json={"instances": x.tolist(), "mc_samples": K,
                                                     "seed": 3})).json()  # fmt: skip
    names = [o["name"] for o in meta["outputs"]]
    assert {"score", FUSED, KDE_SCORE, "mahalanobis_penultimate"} <= set(names)
    outputs = {o["name"]: o["data"] for o in v2["outputs"]}
    assert v2["parameters"]["score_name"] == FUSED
    for b, row in enumerate(v1["predictions"]):
        assert outputs["score"][b] == row["score"] == outputs[FUSED][b]
        for name in DETECTOR_SCORES:
            assert outputs[name][b] == row["scores"][name]
    assert picked.status_code == 200
    assert [o["name"] for o in picked.json()["outputs"]] == [KDE_SCORE]


async def test_admin_decision_over_any_detector_score(
    serving: Callable[[Settings], Any], detector_dir: Path
) -> None:
    headers = {"X-API-Key": KEY}
    detector = load_detector(detector_dir)
    x = {"instances": [[0.5] * 784], "mc_samples": K, "seed": 1}
    async with serving(_settings(detector_dir, api_key=KEY)) as (_, client):
        changed = await client.put("/admin/threshold", json={"score": KDE_SCORE}, headers=headers)
        row = (await client.post("/v1/predict", json=x)).json()["predictions"][0]
        bad = await client.put("/admin/threshold", json={"score": "nope"}, headers=headers)
        cleared = await client.delete("/admin/threshold", headers=headers)
    assert changed.status_code == 200, changed.text
    assert changed.json()["score"] == KDE_SCORE
    assert changed.json()["threshold"] == detector.thresholds[KDE_SCORE]
    assert row["score_name"] == KDE_SCORE and row["score"] == row["scores"][KDE_SCORE]
    assert row["adversarial"] == (row["score"] > detector.thresholds[KDE_SCORE])
    assert bad.status_code in (400, 422) and "nope" in bad.json()["error"]
    assert cleared.json()["score"] == FUSED


def test_startup_refuses_a_changed_or_missing_detector(detector_dir: Path, tmp_path: Path) -> None:
    changed = Path(shutil.copytree(detector_dir, tmp_path / "changed"))
    meta = json.loads((changed / DETECTOR_JSON).read_text())
    meta["thresholds"][FUSED] = -100.0  # flag everything, without re-linking
    (changed / DETECTOR_JSON).write_text(json.dumps(meta))
    with pytest.raises(StartupError, match=r"differs from calibration\.json"):
        load_served_model(changed, "cpu")
    missing = Path(shutil.copytree(detector_dir, tmp_path / "missing"))
    (missing / DETECTOR_JSON).unlink()
    with pytest.raises(StartupError, match="not found"):
        load_served_model(missing, "cpu")
    # re-linked by hash: accepted (the hash is what ties the file to the calibration)
    cal = read_calibration(changed)
    digest = hashlib.sha256((changed / DETECTOR_JSON).read_bytes()).hexdigest()
    cal.detector = {"file": DETECTOR_JSON, "sha256": digest}
    write_calibration(cal, changed)
    served = load_served_model(changed, "cpu")
    assert served.decision.score == FUSED and served.decision.threshold == -100.0
    assert np.isfinite(served.detector.thresholds[KDE_SCORE])
