"""``bayesgate calibrate`` beside a fused detector: the one line saying the flag stays with the
detector (or that a detector of other weights is not linked), and the validation progress bar."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bayesgate.attacks import detector_cli
from bayesgate.attacks.calibrate import calibrate, detector_note
from bayesgate.attacks.pipeline import clean_run
from bayesgate.cli import main
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.detection.store import DETECTOR_JSON, DETECTOR_TENSORS
from bayesgate.models.store.calibration import read_calibration
from bayesgate.models.store.directory import load_model, read_card

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "pretrained" / "bayesgate-robust"
OTHER = "0" * 64
ARGS = [
    "--val-limit",
    "100",
    "--test-limit",
    "20",
    "--k",
    "4",
    "--k-attack",
    "2",
    "--attacks",
    "fgs:eta=0.3",
    "--no-report",
    "--no-progress",
]


def _with_detector(directory: Path, weights_sha256: str | None) -> Path:
    """The bundled detector's files in ``directory``, stamped for ``weights_sha256`` (``None``:
    left as fitted, for the bundled weights)."""
    for name in (DETECTOR_JSON, DETECTOR_TENSORS):
        shutil.copyfile(BUNDLED / name, directory / name)
    if weights_sha256 is not None:
        meta = json.loads((directory / DETECTOR_JSON).read_text())
        meta["model_sha256"] = weights_sha256
        (directory / DETECTOR_JSON).write_text(json.dumps(meta))
    return directory


def test_the_note_names_the_detector_and_fit_detectors_real_flag(tmp_path: Path) -> None:
    sha = read_card(BUNDLED).weights_sha256
    note = detector_note(BUNDLED, sha, "variation_ratio", 0.01)
    assert note is not None and "\n" not in note
    assert "stays with the fused detector" in note and "fused > 3.095" in note
    assert (
        "target FPR 0.05, K 20" in note and "variation_ratio's threshold at target FPR 0.01" in note
    )
    assert f"bayesgate fit-detector {BUNDLED} --target-fpr" in note
    parser = argparse.ArgumentParser()
    detector_cli.register(parser.add_subparsers())
    fit = parser.parse_args(["fit-detector", "m", "--target-fpr", "0.01"])
    assert fit.target_fpr == 0.01  # the flag the note names is fit-detector's

    other = detector_note(BUNDLED, OTHER, "predictive_entropy", 0.05)
    assert other is not None and "\n" not in other
    assert "fitted for other weights" in other and "does not link it" in other
    assert f"re-run `bayesgate fit-detector {BUNDLED}`" in other
    assert detector_note(tmp_path, sha, "predictive_entropy", 0.05) is None  # no detector.json


def test_calibrate_cli_says_the_detector_keeps_the_flag(
    model_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = read_card(model_copy).weights_sha256
    _with_detector(model_copy, sha)
    args = [a for a in ARGS if a != "--no-report"]
    assert main(["calibrate", str(model_copy), "--score", "variation_ratio", *args]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "note:" in line]
    assert len(lines) == 1 and "stays with the fused detector" in lines[0]
    assert "--target-fpr" in lines[0]
    assert read_calibration(model_copy, weights_sha256=sha).detector is not None  # linked
    report = (model_copy / "calibration.md").read_text()
    assert "The service does not flag by this score" in report
    assert "bayesgate fit-detector MODEL --target-fpr" in report


def test_calibrate_cli_says_a_detector_of_other_weights_is_not_linked(
    model_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_detector(model_copy, OTHER)
    assert main(["calibrate", str(model_copy), *ARGS]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "note:" in line]
    assert len(lines) == 1 and "fitted for other weights" in lines[0]
    assert "re-run `bayesgate fit-detector" in lines[0]
    assert read_calibration(model_copy).detector is None


def test_calibrate_without_a_detector_prints_no_note(
    model_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a for a in ARGS if a != "--no-report"]
    assert main(["calibrate", str(model_copy), *args]) == 0
    assert "note:" not in capsys.readouterr().err
    assert "does not flag by this score" not in (model_copy / "calibration.md").read_text()


def test_validation_scoring_has_a_progress_bar_and_the_same_scores(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = load_model(tiny_model_dir)
    kwargs = {"k": 3, "k_attack": 2, "attacks": ["fgs:eta=0.3"], "val_limit": 100, "test_limit": 10}
    quiet = calibrate(loaded, **kwargs)  # type: ignore[arg-type]
    assert "MC K=3" not in capsys.readouterr().err
    shown = calibrate(loaded, progress=True, **kwargs)  # type: ignore[arg-type]
    assert "MC K=3" in capsys.readouterr().err
    x_val, _ = load_mnist("val", val_size=loaded.card.training.val_size, limit=100)
    reference = clean_run(loaded.network, x_val, 3).scores  # the pipeline's own step 1
    for run in (quiet, shown):
        assert run.val_scores.keys() == reference.keys()
        for name, scores in reference.items():
            np.testing.assert_array_equal(run.val_scores[name], scores)
