"""``calibration.json``: round trip, binding to the weights' sha256, and validation errors."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from bayesgate.models.store.calibration import (
    CALIBRATION_FORMAT,
    Calibration,
    read_calibration,
    write_calibration,
)
from bayesgate.models.store.directory import CALIBRATION_FILE, ModelStoreError

SHA = "ab" * 32


def _calibration(**changes) -> Calibration:
    fields = {
        "model_sha256": SHA,
        "score": "mutual_information",
        "target_fpr": 0.05,
        "k": 10,
        "thresholds": {
            "predictive_entropy": 0.81,
            "mutual_information": 0.0625,
            "variation_ratio": 0.2,
        },
        "validation": {"images": 1000, "split": "val"},
        "attacks": [{"name": "fgs", "eps": 0.1, "auroc": 0.93}],
    }
    fields.update(changes)
    return Calibration(**fields)


def _write_json(directory: Path, data) -> None:
    (directory / CALIBRATION_FILE).write_text(json.dumps(data))


def _as_dict(**changes) -> dict:
    data = asdict(_calibration())
    data.update(changes)
    return data


def test_round_trip(tmp_path: Path) -> None:
    cal = _calibration()
    path = write_calibration(cal, tmp_path)
    assert path == tmp_path / CALIBRATION_FILE
    assert cal.created  # filled on write
    back = read_calibration(tmp_path)
    assert back == cal
    assert back.threshold == 0.0625
    assert back.format == CALIBRATION_FORMAT
    assert read_calibration(tmp_path, weights_sha256=SHA) == cal
    on_disk = json.loads(path.read_text())
    assert on_disk["thresholds"]["predictive_entropy"] == 0.81
    assert on_disk["attacks"] == [{"name": "fgs", "eps": 0.1, "auroc": 0.93}]
    assert [p.name for p in tmp_path.iterdir()] == [CALIBRATION_FILE]  # no temporaries left


def test_threshold_follows_the_active_score() -> None:
    assert _calibration(score="variation_ratio").threshold == 0.2
    assert _calibration(score="predictive_entropy").threshold == 0.81


def test_sha_mismatch_is_rejected(tmp_path: Path) -> None:
    write_calibration(_calibration(), tmp_path)
    with pytest.raises(ModelStoreError, match="re-run `bayesgate calibrate`") as info:
        read_calibration(tmp_path, weights_sha256="cd" * 32)
    assert str(tmp_path / CALIBRATION_FILE) in str(info.value)
    assert "abababab" in str(info.value) and "cdcdcdcd" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelStoreError, match="calibration not found") as info:
        read_calibration(tmp_path)
    assert str(tmp_path / CALIBRATION_FILE) in str(info.value)


@pytest.mark.parametrize("text", ["{oops", "", '{"score": '])
def test_bad_json(tmp_path: Path, text: str) -> None:
    (tmp_path / CALIBRATION_FILE).write_text(text)
    with pytest.raises(ModelStoreError, match="not valid JSON") as info:
        read_calibration(tmp_path)
    assert str(tmp_path / CALIBRATION_FILE) in str(info.value)


@pytest.mark.parametrize(
    "data",
    [[1, 2], "calibration", _as_dict(format="bayesgate-calibration/0"), _as_dict(format=None)],
    ids=["list", "string", "old-format", "no-format"],
)
def test_wrong_format(tmp_path: Path, data) -> None:
    _write_json(tmp_path, data)
    with pytest.raises(ModelStoreError, match=f"not a {CALIBRATION_FORMAT} file"):
        read_calibration(tmp_path)


def test_unknown_score(tmp_path: Path) -> None:
    _write_json(tmp_path, _as_dict(score="softmax_margin"))
    with pytest.raises(ModelStoreError, match="unknown score 'softmax_margin'"):
        read_calibration(tmp_path)
    thresholds = {**_calibration().thresholds, "softmax_margin": 0.3}
    _write_json(tmp_path, _as_dict(thresholds=thresholds))
    with pytest.raises(ModelStoreError, match="invalid threshold entries: softmax_margin"):
        read_calibration(tmp_path)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_threshold(tmp_path: Path, value: str) -> None:
    # json.dumps writes NaN/Infinity as bare tokens that json.loads accepts: they must not pass
    text = json.dumps(_as_dict()).replace(
        '"mutual_information": 0.0625', f'"mutual_information": {value}'
    )
    assert value in text
    (tmp_path / CALIBRATION_FILE).write_text(text)
    with pytest.raises(ModelStoreError, match="invalid threshold entries: mutual_information"):
        read_calibration(tmp_path)
    with pytest.raises(ValueError, match="invalid threshold entries"):
        _calibration(thresholds={"mutual_information": math.nan})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"thresholds": {"predictive_entropy": 0.5}}, "no threshold for the active score"),
        ({"target_fpr": 0.0}, "target_fpr must be in"),
        ({"target_fpr": 1.5}, "target_fpr must be in"),
        ({"k": 0}, "k must be"),
        ({"thresholds": {"mutual_information": "high"}}, "must be real number|invalid threshold"),
        ({"thresholds": ["mutual_information"]}, "thresholds must be"),
        ({"k": "ten"}, "not supported|k must be"),
    ],
)
def test_invalid_fields(tmp_path: Path, changes: dict, message: str) -> None:
    _write_json(tmp_path, _as_dict(**changes))
    with pytest.raises(ModelStoreError, match=message) as info:
        read_calibration(tmp_path)
    assert str(tmp_path / CALIBRATION_FILE) in str(info.value)


@pytest.mark.parametrize("field", ["model_sha256", "score", "thresholds", "k", "target_fpr"])
def test_missing_required_field(tmp_path: Path, field: str) -> None:
    data = _as_dict()
    del data[field]
    _write_json(tmp_path, data)
    with pytest.raises(ModelStoreError, match=field):
        read_calibration(tmp_path)
