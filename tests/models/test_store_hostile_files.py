"""The store's readers against hostile file content: every problem is one
:class:`ModelStoreError` naming the file and the field, before anything is built or served.

- :func:`read_json_object` (card, calibration, detector): nesting, integers outside 64 bits,
  lone surrogates — found with their field path, never a ``RecursionError`` or ``ValueError``;
- :func:`architecture_problem` and :func:`load_model`: the card's architecture numbers are
  checked before building, the network is sized on the ``meta`` device against the weights file
  (a card asking for 10⁹ hidden units allocates nothing), and the card's ``input.shape`` and
  ``classes`` must fit the network;
- :class:`Calibration`: each field strictly typed (``k`` a positive int, not ``true`` or 2.5).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bayesgate.models.detection.store import DETECTOR_JSON, load_detector
from bayesgate.models.networks.registry import build_network, preset_architecture
from bayesgate.models.store.calibration import (
    MAX_K,
    Calibration,
    read_calibration,
    write_calibration,
)
from bayesgate.models.store.checks import MAX_JSON_DEPTH, architecture_problem
from bayesgate.models.store.directory import (
    CALIBRATION_FILE,
    CARD_FILE,
    WEIGHTS_FILE,
    ModelCard,
    ModelStoreError,
    load_model,
    read_json_object,
    save_model,
)

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "pretrained" / "bayesgate-robust"
SHA = "ab" * 32


def _read(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "file.json"
    path.write_text(text)
    return read_json_object(path, "missing", "an object")


# --- read_json_object --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"training": {"seed": ' + "9" * 5000 + "}}", "training.seed: integer of 5000 digits"),
        ('{"a": [1, ' + str(2**63) + "]}", "a.1: integer 9223372036854775808 is outside"),
        ('{"a": -' + str(2**63 + 1) + "}", "a: integer -9223372036854775809 is outside"),
        ('{"a": ' + "[" * 100000 + "]" * 100000 + "}", "not valid JSON (nested deeper than"),
        ("[" * 100000 + "]" * 100000, "not valid JSON (nested deeper than"),
        ('{"x": ' + "[" * 70 + "]" * 70 + "}", "x.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0"),
        ('{"name": "\\ud800"}', "name: string is not valid Unicode"),
        ('{"m": {"\\udfff": 1}}', "key is not valid Unicode"),
        ('{"a": 1e5000, "b": ', "not valid JSON"),
    ],
    ids=[
        "5000-digits",
        "2**63",
        "-2**63-1",
        "deep-in-object",
        "deep-list",
        "depth-70",
        "lone-surrogate",
        "surrogate-key",
        "truncated",
    ],
)
def test_json_reader_names_the_file_and_field(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ModelStoreError) as info:
        _read(tmp_path, text)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'file.json'}: ") and says in message, message
    assert "\n" not in message and len(message) < 300


def test_json_reader_keeps_what_the_store_writes(tmp_path: Path) -> None:
    edge = '{"a": 9223372036854775807, "b": -9223372036854775808, "c": "é\\u00e9", "d": 1e308}'
    assert _read(tmp_path, edge) == {
        "a": 2**63 - 1,
        "b": -(2**63),
        "c": "éé",
        "d": 1e308,
    }
    nested: Any = 1
    for _ in range(MAX_JSON_DEPTH - 1):
        nested = [nested]
    assert _read(tmp_path, json.dumps({"x": nested}))["x"] == nested


def test_the_detector_reader_goes_through_the_same_checks(tmp_path: Path) -> None:
    (tmp_path / DETECTOR_JSON).write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ModelStoreError, match="not valid JSON") as info:
        load_detector(tmp_path)
    assert str(tmp_path / DETECTOR_JSON) in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("k", 2.5, "k must be a positive integer (at most 1,000,000), got 2.5"),
        ("k", True, "k must be a positive integer (at most 1,000,000), got true"),
        ("target_fpr", "0.05", 'target_fpr must be in (0, 1), got "0.05"'),
        ("thresholds", [], "thresholds must be a JSON object, got []"),
        ("mahalanobis", "x", 'mahalanobis must be a JSON object, got "x"'),
        ("conformal", [1], "conformal must be a JSON object or null, got [1]"),
        ("model_sha256", 5, "model_sha256 must be a string, got 5"),
    ],
)
def test_detector_fields_are_strict(tmp_path: Path, key: str, value: Any, says: str) -> None:
    """Was: ``k`` 2.5 read as 2 and ``true`` as 1; a list where an object belongs raised an
    AttributeError (a traceback, or a 500 on reload)."""
    directory = tmp_path / "model"
    shutil.copytree(BUNDLED, directory)
    path = directory / DETECTOR_JSON
    meta = json.loads(path.read_text())
    meta[key] = value
    path.write_text(json.dumps(meta))
    with pytest.raises(ModelStoreError) as info:
        load_detector(directory)
    assert str(info.value) == f"{path}: {says}"


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda m: m["thresholds"].update(fused=True), "thresholds: fused must be finite numbers"),
        (lambda m: m["kde"].update(bandwidth=-1), "kde.bandwidth must be a positive number"),
        (lambda m: m["fusion"].update(names=None), "TypeError: 'NoneType' object is not iterable"),
    ],
)
def test_detector_sections_name_the_problem(tmp_path: Path, edit: Any, says: str) -> None:
    directory = tmp_path / "model"
    shutil.copytree(BUNDLED, directory)
    path = directory / DETECTOR_JSON
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(ModelStoreError) as info:
        load_detector(directory)
    assert str(info.value).startswith(f"{path}: {says}"), str(info.value)


# --- the architecture, the input shape and the classes -----------------------------------------


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"hidden": -5}, "architecture.hidden: must be a positive integer"),
        ({"hidden": [32, 0]}, "architecture.hidden"),
        ({"hidden": []}, "architecture.hidden"),
        ({"hidden": 2.5}, "architecture.hidden"),
        ({"hidden": True}, "architecture.hidden"),
        ({"channels": [-1, 64]}, "architecture.channels"),
        ({"classes": 0}, "architecture.classes: must be a positive integer"),
        ({"in_shape": [1, -28, 28]}, "architecture.in_shape"),
        ({"in_shape": []}, "architecture.in_shape"),
        ({"p": 1.5}, "architecture.p: must be a number in [0, 1)"),
        ({"p": "0.5"}, "architecture.p"),
        ({"p": math.nan}, "architecture.p"),
        ({"stochastic": "yes"}, "architecture.stochastic: must be true or false"),
        ({"type": ["dropout_mlp"]}, "architecture.type: must be a string"),
        ({"conv1_padding": -1}, "architecture.conv1_padding"),
        ({"rho_init": "low"}, "architecture.rho_init"),
    ],
)
def test_architecture_numbers_are_checked_before_building(change: dict, says: str) -> None:
    problem = architecture_problem({**preset_architecture("mlp-2x32"), **change})
    assert problem is not None and problem.startswith(says), problem


@pytest.mark.parametrize("preset", ["mlp-2x32", "cnn", "cnn-wide", "bbb-lenet5", "bbb-alexnet"])
def test_every_preset_passes_the_architecture_check(preset: str) -> None:
    assert architecture_problem(preset_architecture(preset)) is None


@pytest.fixture
def mlp_dir(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    arch = preset_architecture("mlp-2x32")
    directory = tmp_path / "mlp"
    save_model(build_network(arch), ModelCard(name="m", architecture=arch), directory)
    return directory


def _edit(directory: Path, *keys: str, value: Any) -> Path:
    path = directory / CARD_FILE
    data = json.loads(path.read_text())
    inner = data
    for key in keys[:-1]:
        inner = inner[key]
    inner[keys[-1]] = value
    path.write_text(json.dumps(data))
    return path


def test_a_huge_architecture_is_refused_without_allocating_it(mlp_dir: Path) -> None:
    """10⁹ × 784 float32 would be 3 TB: sized on the meta device, compared with the file."""
    _edit(mlp_dir, "architecture", "hidden", value=[10**9, 32])
    with pytest.raises(ModelStoreError, match="weights do not fit the card's architecture") as e:
        load_model(mlp_dir)
    assert str(mlp_dir / WEIGHTS_FILE) in str(e.value)
    assert "[1000000000, 784] in the card" in str(e.value)


@pytest.mark.parametrize(
    ("keys", "value", "says"),
    [
        (("input", "shape"), [1, 32, 32], "input.shape [1, 32, 32] does not fit the network"),
        (("input", "shape"), [3, 28, 28], "input.shape [3, 28, 28] does not fit the network"),
        (("classes",), ["a", "b"], "classes: 2 class names, but the network has 10 outputs"),
        (("classes",), [], "classes: 0 class names"),
    ],
)
def test_the_card_must_fit_the_network(mlp_dir: Path, keys: tuple, value: Any, says: str) -> None:
    path = _edit(mlp_dir, *keys, value=value)
    with pytest.raises(ModelStoreError) as info:
        load_model(mlp_dir)
    assert str(info.value) == f"{path}: {says}" or str(info.value).startswith(f"{path}: {says}")


def test_an_input_shape_with_the_same_values_in_another_layout_is_accepted(mlp_dir: Path) -> None:
    """The MLP flattens its input: ``[784]`` and ``[28, 28]`` are the same 784 values."""
    for shape in ([784], [28, 28]):
        _edit(mlp_dir, "input", "shape", value=shape)
        assert load_model(mlp_dir).card.input.shape == shape


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ([784], "Expected 3D (unbatched) or 4D (batched) input to conv2d"),
        ([3, 32, 32], "built for inputs of shape [1, 28, 28] (architecture.in_shape)"),
    ],
)
def test_a_cnn_refuses_a_flat_or_other_input_shape(
    tmp_path: Path, shape: list[int], says: str
) -> None:
    directory = tmp_path / "cnn"
    shutil.copytree(BUNDLED, directory)
    path = _edit(directory, "input", "shape", value=shape)
    with pytest.raises(ModelStoreError) as info:
        load_model(directory)
    assert str(info.value).startswith(f"{path}: input.shape {shape} does not fit the network")
    assert says in str(info.value)


def test_the_load_checks_leave_the_global_rng_alone(mlp_dir: Path) -> None:
    """Loading draws what building the network draws (its initialisation), nothing more: the
    meta-device build and the check's forward pass (eval mode) draw no global random numbers
    (a reload loads beside the worker, which draws from that generator for unseeded requests)."""
    card = json.loads((mlp_dir / CARD_FILE).read_text())
    torch.manual_seed(123)
    build_network(card["architecture"])
    expected = torch.rand(4)
    torch.manual_seed(123)
    load_model(mlp_dir)
    assert torch.equal(torch.rand(4), expected)


# --- calibration.json ----------------------------------------------------------------------------


def _fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "model_sha256": SHA,
        "score": "mutual_information",
        "target_fpr": 0.05,
        "k": 10,
        "thresholds": {"predictive_entropy": 0.8, "mutual_information": 0.06},
    }
    return {**fields, **changes}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"k": 2.5}, "k must be a positive integer (at most 1,000,000), got 2.5"),
        ({"k": True}, "k must be a positive integer (at most 1,000,000), got true"),
        ({"k": "10"}, 'k must be a positive integer (at most 1,000,000), got "10"'),
        ({"k": 0}, "k must be a positive integer"),
        ({"k": MAX_K + 1}, "k must be a positive integer"),
        ({"k": None}, "k must be a positive integer"),
        ({"target_fpr": True}, "target_fpr must be in (0, 1), got true"),
        ({"target_fpr": "0.05"}, "target_fpr must be in (0, 1)"),
        ({"target_fpr": math.nan}, "target_fpr must be in (0, 1)"),
        (
            {"thresholds": {"mutual_information": True}},
            "invalid threshold entries: mutual_information",
        ),
        ({"thresholds": {"mutual_information": "0.1"}}, "invalid threshold entries"),
        ({"model_sha256": 5}, "model_sha256 must be a sha256 (64 lowercase hex digits), got 5"),
        ({"model_sha256": "AB" * 32}, "model_sha256 must be a sha256"),
        ({"model_sha256": "ab" * 31}, "model_sha256 must be a sha256"),
        ({"score": ["mutual_information"]}, "unknown score"),
        ({"validation": [1, 2]}, "validation must be a JSON object"),
        ({"attacks": {"fgs": 0.9}}, "attacks must be a list of JSON objects"),
        ({"attacks": ["fgs"]}, "attacks must be a list of JSON objects"),
        ({"detector": {"file": "detector.json", "sha256": 5}}, "detector must be"),
        ({"detector": {"file": 5, "sha256": SHA}}, "detector must be"),
        ({"created": 20261124}, "created must be a string"),
    ],
)
def test_calibration_fields_are_strict(tmp_path: Path, changes: dict, says: str) -> None:
    with pytest.raises(ValueError) as direct:
        Calibration(**_fields(**changes))
    assert str(direct.value).startswith(says), str(direct.value)
    data = {**_fields(**changes), "format": "bayesgate-calibration/1"}
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps(data))
    with pytest.raises(ModelStoreError) as read:
        read_calibration(tmp_path)
    assert str(read.value) == f"{tmp_path / CALIBRATION_FILE}: {direct.value}"


def test_calibration_numbers_are_stored_as_plain_int_and_float(tmp_path: Path) -> None:
    """numpy scalars from code and JSON integers from files become ``int``/``float``."""
    cal = Calibration(
        **_fields(
            k=np.int64(20),
            target_fpr=np.float32(0.25),
            thresholds={"mutual_information": np.float32(0.5), "predictive_entropy": 1},
        )
    )
    assert type(cal.k) is int and cal.k == 20
    assert type(cal.target_fpr) is float and cal.target_fpr == 0.25
    assert all(type(t) is float for t in cal.thresholds.values())
    with pytest.raises(ValueError, match="invalid threshold entries: mutual_information"):
        Calibration(**_fields(thresholds={"mutual_information": 10**400}))  # too large a float
    write_calibration(cal, tmp_path)
    assert read_calibration(tmp_path) == cal


def test_calibration_lacking_a_field_names_it(tmp_path: Path) -> None:
    data = {**_fields(), "format": "bayesgate-calibration/1"}
    del data["k"], data["score"]
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps(data))
    with pytest.raises(ModelStoreError) as info:
        read_calibration(tmp_path)
    assert str(info.value) == f"{tmp_path / CALIBRATION_FILE}: lacks required field(s) score, k"
