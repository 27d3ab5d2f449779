"""What describes the flag of a model with a fused detector: ``/v1/models``' target FPR, K,
threshold and AUROCs, the default K of a request and ``calibration_mc_samples`` come from the file
that set the flag's threshold (``detector.json`` when the detector decides), not a mix of
``calibration.json`` and ``detector.json``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bayesgate.models.detection import FUSED, KDE_SCORE
from bayesgate.models.detection.store import DETECTOR_JSON
from bayesgate.service.control import with_decision
from bayesgate.service.deps import default_mc_samples
from bayesgate.service.served_model import (
    DecisionOverride,
    ServedModel,
    attack_aurocs,
    load_served_model,
)
from bayesgate.service.settings import Settings

PRETRAINED = Path(__file__).resolve().parents[2] / "models" / "pretrained"
BUNDLED = sorted(p.name for p in PRETRAINED.iterdir() if (p / DETECTOR_JSON).is_file())


@pytest.fixture(scope="module")
def robust() -> ServedModel:
    return load_served_model(PRETRAINED / "bayesgate-robust", "cpu")


@pytest.fixture(scope="module")
def apart(robust: ServedModel) -> ServedModel:
    """The bundled model with calibration.json at K 7 and FPR 2 % and the detector at K 10 and
    FPR 1 % (the thresholds and AUROCs are the files')."""
    calibration = dataclasses.replace(robust.calibration, k=7, target_fpr=0.02)
    assert robust.detector is not None
    detector = dataclasses.replace(robust.detector, k=10, target_fpr=0.01)
    return dataclasses.replace(robust, calibration=calibration, detector=detector)


def _settings(**overrides: Any) -> Settings:
    return Settings(**{"model_dir": PRETRAINED / "bayesgate-robust", "device": "cpu", **overrides})


def _fit_aurocs(served: ServedModel, score: str) -> dict[str, float]:
    assert served.detector is not None
    return {a: e["auroc"][score] for a, e in served.detector.fit["attacks"].items()}


def test_summary_describes_the_detectors_flag(apart: ServedModel) -> None:
    detector, cal = apart.detector, apart.calibration
    assert detector is not None
    summary = apart.summary()["calibration"]
    assert summary["score"] == FUSED and summary["threshold"] == detector.threshold
    assert summary["target_fpr"] == 0.01 and summary["mc_samples"] == 10
    assert summary["decided_by"] == "detector" and summary["threshold_source"] == DETECTOR_JSON
    # the fused score's AUROC per attack, from the detector's fit report, not calibration.json's
    assert summary["auroc"] == _fit_aurocs(apart, FUSED) != attack_aurocs(cal.attacks)
    assert summary["auroc_score"] == FUSED and summary["auroc_source"] == DETECTOR_JSON
    # calibration.json's own figures stay readable, under their own key
    assert summary["calibration_file"] == {
        "score": cal.score,
        "threshold": cal.threshold,
        "target_fpr": 0.02,
        "mc_samples": 7,
        "auroc": attack_aurocs(cal.attacks),
    }
    assert summary["detector"]["target_fpr"] == 0.01 and summary["detector"]["mc_samples"] == 10
    json.dumps(summary, allow_nan=False)


def test_default_k_and_calibration_k_are_the_detectors(apart: ServedModel) -> None:
    assert apart.ref.calibration_mc_samples == 10
    assert default_mc_samples(_settings(), apart) == 10
    assert default_mc_samples(_settings(max_mc_samples=4), apart) == 4  # the cap still holds
    assert default_mc_samples(_settings(default_mc_samples=3), apart) == 3
    without = dataclasses.replace(apart, detector=None)  # calibration.json decides: its K
    assert without.ref.calibration_mc_samples == 7 == default_mc_samples(_settings(), without)
    summary = without.summary()["calibration"]
    assert (summary["target_fpr"], summary["mc_samples"], summary["decided_by"]) == (
        0.02,
        7,
        "calibration",
    )
    assert summary["auroc"] == attack_aurocs(without.calibration.attacks)
    assert summary["auroc_source"] == "calibration.json"


def test_override_reports_the_figures_of_its_scores_file(apart: ServedModel) -> None:
    cal, detector = apart.calibration, apart.detector
    assert detector is not None

    def summary(score: str, threshold: float) -> dict[str, Any]:
        served = with_decision(apart, DecisionOverride(score, threshold, "2026-01-01T00:00:00"))
        out = served.summary()["calibration"]
        assert out["mc_samples"] == served.ref.calibration_mc_samples
        assert out["mc_samples"] == default_mc_samples(_settings(), served)
        return out

    # an uncertainty score: calibration.json's threshold, K, FPR and that score's AUROCs
    vr = summary("variation_ratio", cal.thresholds["variation_ratio"])
    assert (vr["decided_by"], vr["threshold_source"]) == ("override", "calibration.json")
    assert (vr["target_fpr"], vr["mc_samples"]) == (0.02, 7)
    assert vr["auroc"] == {
        a["attack"]: a["scores"]["variation_ratio"]["auroc"] for a in cal.attacks
    }
    assert vr["auroc_score"] == "variation_ratio"
    # a detector score: the detector's
    kde = summary(KDE_SCORE, detector.thresholds[KDE_SCORE])
    assert (kde["threshold_source"], kde["target_fpr"], kde["mc_samples"]) == (
        DETECTOR_JSON,
        0.01,
        10,
    )
    assert kde["auroc"] == _fit_aurocs(apart, KDE_SCORE)
    assert vr["target_fpr_applies"] and kde["target_fpr_applies"]
    # a threshold of the admin's own: no fit set it, so the file's target FPR (still a number,
    # as it always was in this field) does not apply
    own = summary(FUSED, 1.0)
    assert own["threshold"] == 1.0 and own["mc_samples"] == 10
    assert own["target_fpr"] == 0.01 and own["target_fpr_applies"] is False


def test_no_auroc_of_another_score_is_shown_as_the_flags(apart: ServedModel) -> None:
    assert apart.detector is not None
    bare = dataclasses.replace(apart, detector=dataclasses.replace(apart.detector, fit={}))
    summary = bare.summary()["calibration"]
    assert summary["score"] == FUSED
    assert summary["auroc"] == {} and summary["auroc_source"] is None
    assert summary["calibration_file"]["auroc"] == attack_aurocs(apart.calibration.attacks)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_models_default_k_is_unchanged(name: str) -> None:
    """Both files of each bundled model were fitted at the same K and FPR, so what their
    requests run and report is what it was when calibration.json's K decided."""
    served = load_served_model(PRETRAINED / name, "cpu")
    cal = json.loads((PRETRAINED / name / "calibration.json").read_text())
    det = json.loads((PRETRAINED / name / DETECTOR_JSON).read_text())
    assert cal["k"] == det["k"] == 20 and cal["target_fpr"] == det["target_fpr"] == 0.05
    assert served.ref.calibration_mc_samples == cal["k"]
    assert default_mc_samples(_settings(), served) == cal["k"]
    summary = served.summary()["calibration"]
    assert (summary["mc_samples"], summary["target_fpr"]) == (cal["k"], cal["target_fpr"])


@pytest.mark.anyio
async def test_a_request_without_k_runs_the_detectors_k(
    serving: Callable[[Settings], Any], tmp_path: Path
) -> None:
    """calibration.json at K 20, the detector re-stamped at K 4 and linked again: a request
    without ``mc_samples`` runs K 4 and says the threshold belongs to K 4; /v1/models agrees."""
    directory = Path(shutil.copytree(PRETRAINED / "bayesgate-robust", tmp_path / "model"))
    meta = json.loads((directory / DETECTOR_JSON).read_text())
    meta["k"] = 4
    (directory / DETECTOR_JSON).write_text(json.dumps(meta))
    cal = json.loads((directory / "calibration.json").read_text())
    cal["detector"]["sha256"] = hashlib.sha256((directory / DETECTOR_JSON).read_bytes()).hexdigest()
    (directory / "calibration.json").write_text(json.dumps(cal))
    settings = Settings(model_dir=directory, device="cpu", max_queue_delay_ms=2.0, max_batch_size=4)
    async with serving(settings) as (_, client):
        answer = (await client.post("/v1/predict", json={"instances": [[0.0] * 784]})).json()
        model = (await client.get("/v1/models")).json()["models"][0]["calibration"]
    assert answer["mc_samples"] == 4 and answer["calibration_mc_samples"] == 4
    assert model["mc_samples"] == 4 and model["calibration_file"]["mc_samples"] == 20


def test_a_max_k_below_the_flag_s_k_is_warned_about_once_at_start(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``BAYESGATE_MAX_MC_SAMPLES`` under the flag's K caps the default K: one warning naming both
    Ks and the file; none when the cap is at the flag's K or a default K is set."""
    from bayesgate.service import app
    from bayesgate.service.served_model import load_served_model

    lines: list[str] = []
    monkeypatch.setattr(app.log, "warning", lambda fmt, *args: lines.append(fmt % args))
    served = load_served_model(tiny_model_dir, "cpu")
    k = served.basis.k

    def settings(**values: Any) -> Settings:
        return Settings(model_dir=tiny_model_dir, **values)

    assert app.warn_if_default_k_capped(settings(max_mc_samples=k - 1), served)
    assert len(lines) == 1 and f"default K {k - 1}" in lines[0] and f"the K {k} " in lines[0]
    assert "calibration.json" in lines[0]
    assert not app.warn_if_default_k_capped(settings(max_mc_samples=k), served)
    capped_but_set = settings(max_mc_samples=k - 1, default_mc_samples=1)
    assert not app.warn_if_default_k_capped(capped_but_set, served)
    assert len(lines) == 1


@pytest.mark.anyio
async def test_the_start_up_warns_when_the_default_k_is_capped(
    make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm-up calls the check: a server started with BAYESGATE_MAX_MC_SAMPLES under the
    flag's K logs the warning once; one started without the cap logs none."""
    from bayesgate.service import app as app_module
    from tests.service.conftest import running_app

    lines: list[str] = []
    monkeypatch.setattr(app_module.log, "warning", lambda fmt, *a: lines.append(fmt % a))
    k = load_served_model(make_settings().model_dir, "cpu").basis.k
    async with running_app(make_settings(max_mc_samples=k - 1)):
        pass
    assert len([line for line in lines if line.startswith(f"default K {k - 1} ")]) == 1
    lines.clear()
    async with running_app(make_settings()):
        pass
    assert not [line for line in lines if line.startswith("default K")]
