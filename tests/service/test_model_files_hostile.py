"""Hostile model files: a copy of the bundled model with one file broken, through every path that
loads a model directory.

Each broken copy must give one clear line naming the file and the field, and nothing else:

- the start-up check (:func:`load_served_model`, run by ``bayesgate serve`` before uvicorn
  starts, and by the app's lifespan): a :class:`StartupError`, never a traceback or a model that
  fails its first request;
- the CLI: ``bayesgate serve --model-dir COPY`` and ``bayesgate evaluate COPY`` print
  ``bayesgate: error: …`` and return 2;
- ``POST /admin/reload``: 409 ``reload_failed`` naming the file, the old model keeps serving
  (``/readyz`` ready, a prediction without ``mc_samples`` answered by the old weights).

Before the fix a calibration ``"k": 2.5`` or ``"k": true`` was served and every prediction without
``mc_samples`` answered 500; a 5000-digit integer, a deeply nested card, ``hidden: -5`` or
``model_sha256: 5`` answered 500 (or printed a traceback); a card whose ``input.shape`` or
``classes`` did not fit the network started (or failed only in the warm-up), and an empty name
made ``/v2/models/{name}`` unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from bayesgate.cli import main
from bayesgate.service.errors import StartupError
from bayesgate.service.served_model import (
    check_answers,
    load_served_model,
    served_name_problem,
)
from bayesgate.service.settings import Settings

BUNDLED = Path(__file__).resolve().parents[2] / "models" / "pretrained" / "bayesgate-robust"
KEY = "0123456789abcdef-admin"
BLANK = [0.0] * 784


@dataclass(frozen=True)
class Broken:
    """One file of the model directory broken: ``edit`` changes its parsed JSON in place, or
    ``text`` replaces its text; the error must contain every string of ``says``."""

    id: str
    file: str
    says: tuple[str, ...]
    edit: Callable[[dict[str, Any]], None] | None = None
    text: Callable[[str], str] | None = None
    served_only: bool = False  # a problem only for serving (the name): other commands load it

    def apply(self, directory: Path) -> Path:
        path = directory / self.file
        if self.text is not None:
            path.write_text(self.text(path.read_text()))
        else:
            assert self.edit is not None
            data = json.loads(path.read_text())
            self.edit(data)
            path.write_text(json.dumps(data, indent=2))
        return path


def _set(*keys: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit setting ``data[k1][k2]… = value``."""

    def edit(data: dict[str, Any]) -> None:
        for key in keys[:-1]:
            data = data[key]
        data[keys[-1]] = value

    return edit


def _big_integer(text: str) -> str:
    data = json.loads(text)
    data["extra"] = "BIG"
    return json.dumps(data).replace('"BIG"', "9" * 5000)


CASES = [
    # calibration.json: every field strictly typed (was: k 2.5 / true served, then 500s)
    Broken(
        "k-float", "calibration.json", ("k must be a positive integer", "2.5"), _set("k", value=2.5)
    ),
    Broken(
        "k-bool",
        "calibration.json",
        ("k must be a positive integer", "true"),
        _set("k", value=True),
    ),
    Broken(
        "k-string", "calibration.json", ("k must be a positive integer",), _set("k", value="20")
    ),
    Broken(
        "threshold-bool",
        "calibration.json",
        ("invalid threshold entries: predictive_entropy",),
        _set("thresholds", "predictive_entropy", value=True),
    ),
    Broken(
        "threshold-string",
        "calibration.json",
        ("invalid threshold entries: mutual_information",),
        _set("thresholds", "mutual_information", value="0.1"),
    ),
    Broken("fpr-bool", "calibration.json", ("target_fpr",), _set("target_fpr", value=True)),
    Broken("fpr-string", "calibration.json", ("target_fpr",), _set("target_fpr", value="0.05")),
    Broken(
        "sha-int",
        "calibration.json",
        ("model_sha256", "64 lowercase hex"),
        _set("model_sha256", value=5),
    ),
    Broken(
        "attacks-object",
        "calibration.json",
        ("attacks must be a list",),
        _set("attacks", value={"fgs": 1}),
    ),
    # card.json: JSON the parser cannot hold, and architecture numbers torch refuses (were 500s)
    Broken("big-integer", "card.json", ("extra", "5000 digits", "64-bit"), text=_big_integer),
    Broken(
        "deep-nesting",
        "card.json",
        ("not valid JSON", "nested deeper"),
        text=lambda _: "[" * 100000 + "]" * 100000,
    ),
    Broken(
        "hidden-negative",
        "card.json",
        ("architecture.hidden", "positive integer", "-5"),
        _set("architecture", "hidden", value=-5),
    ),
    Broken(
        "channels-negative",
        "card.json",
        ("architecture.channels",),
        _set("architecture", "channels", value=[-1, 64]),
    ),
    # card.json against the network (was: not caught before uvicorn, or served wrong metadata)
    Broken(
        "shape-3x32x32",
        "card.json",
        ("input.shape", "[3, 32, 32]"),
        _set("input", "shape", value=[3, 32, 32]),
    ),
    Broken("shape-784", "card.json", ("input.shape", "[784]"), _set("input", "shape", value=[784])),
    Broken(
        "classes-3",
        "card.json",
        ("classes", "3 class names", "10 outputs"),
        _set("classes", value=["a", "b", "c"]),
    ),
    Broken("classes-0", "card.json", ("classes", "0 class names"), _set("classes", value=[])),
    Broken(
        "classes-20",
        "card.json",
        ("classes", "20 class names"),
        _set("classes", value=[str(i) for i in range(20)]),
    ),
    # the name, as the routes must reach it
    Broken("name-empty", "card.json", ("name", "empty"), _set("name", value=""), served_only=True),
    Broken(
        "name-blank", "card.json", ("name", "empty"), _set("name", value="   "), served_only=True
    ),
    Broken(
        "name-slash",
        "card.json",
        ("name", "'/'"),
        _set("name", value="mnist/cnn"),
        served_only=True,
    ),
]
CARD_CASES = [c for c in CASES if c.file == "card.json" and not c.served_only]


def _broken_copy(case: Broken, root: Path) -> tuple[Path, Path]:
    """A copy of the bundled model with ``case`` applied: (directory, broken file)."""
    directory = root / "model"
    shutil.copytree(BUNDLED, directory)
    return directory, case.apply(directory)


def _assert_one_line(message: str, path: Path, case: Broken) -> None:
    assert "\n" not in message.strip() and "Traceback" not in message, message
    assert str(path) in message, message
    for part in case.says:
        assert part in message, (case.id, part, message)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``BAYESGATE_*`` setting from the caller's environment except the data directory."""
    for name in list(os.environ):
        if name.startswith("BAYESGATE_") and name != "BAYESGATE_DATA_DIR":
            monkeypatch.delenv(name)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_start_up_check_names_the_file_and_field(case: Broken, tmp_path: Path) -> None:
    directory, path = _broken_copy(case, tmp_path)
    with pytest.raises(StartupError) as info:
        load_served_model(directory, "cpu")
    _assert_one_line(str(info.value), path, case)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_serve_prints_one_line_before_uvicorn_starts(
    case: Broken,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    clean_env: None,
) -> None:
    directory, path = _broken_copy(case, tmp_path)

    def no_server(config: Any, **_: Any) -> None:
        raise AssertionError(f"{case.id}: the check passed and uvicorn would start")

    monkeypatch.setattr("bayesgate.service.cli.run_uvicorn", no_server)
    assert main(["serve", "--model-dir", str(directory), "--port", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("bayesgate: error: "), captured.err
    assert captured.err.count("\n") == 1
    _assert_one_line(captured.err, path, case)


@pytest.mark.parametrize("case", CARD_CASES, ids=[c.id for c in CARD_CASES])
def test_evaluate_prints_one_line(
    case: Broken, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, path = _broken_copy(case, tmp_path)
    argv = ["evaluate", str(directory), "--k", "2", "--limit", "5", "--no-progress"]
    assert main([*argv, "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("bayesgate: error: ") and captured.err.count("\n") == 1
    _assert_one_line(captured.err, path, case)


def test_a_served_only_problem_leaves_other_commands_alone(tmp_path: Path) -> None:
    """The name matters to the routes only: the store itself loads such a model."""
    from bayesgate.models.store.directory import load_model

    case = next(c for c in CASES if c.id == "name-slash")
    directory, _ = _broken_copy(case, tmp_path)
    assert load_model(directory).card.name == "mnist/cnn"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("cnn-wide-robust", None),
        ("MNIST CNN v2", None),  # inner spaces: %20 in the path reaches it
        ("", "empty"),
        (" \t", "empty"),
        ("a/b", "'/'"),
        ("..", "relative path segment"),
        (" cnn", "leading or trailing whitespace"),
        ("cnn\n", "leading or trailing whitespace"),
        ("cn\x00n", "non-printable"),
        ("x" * 257, "more than 256"),
    ],
)
def test_served_name_rules(name: str, problem: str | None) -> None:
    found = served_name_problem(name)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.anyio
async def test_lifespan_start_up_fails_with_the_one_line(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    """The app's own start-up (what uvicorn runs) refuses ``"k": 2.5`` before the warm-up: a
    :class:`StartupError` naming the file, not a warm-up traceback."""
    case = CASES[0]
    directory, path = _broken_copy(case, tmp_path)
    with pytest.raises(StartupError) as info:
        async with serving(make_settings(model_dir=directory)):
            pass
    _assert_one_line(str(info.value), path, case)


@pytest.mark.anyio
async def test_reload_refuses_each_broken_file_and_keeps_serving(
    serving: Callable[[Settings], Any], make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    shutil.copytree(BUNDLED, store)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with serving(make_settings(model_dir=store, api_key=KEY)) as (app, client):
        sha = app.state.worker.model.sha256
        name = app.state.worker.model.name
        for case in CASES:
            original = (store / case.file).read_bytes()
            path = case.apply(store)
            try:
                r = await client.post("/admin/reload", headers=headers)
                assert r.status_code == 409, (case.id, r.status_code, r.text)
                body = r.json()
                assert body["code"] == "reload_failed", (case.id, body)
                assert "still serving" in body["error"], (case.id, body)
                _assert_one_line(body["error"], path, case)
                # The old model keeps serving, with its own K (no mc_samples) and metadata.
                assert (await client.get("/readyz")).status_code == 200, case.id
                row = await client.post("/v1/predict", json={"instances": [BLANK]})
                assert row.status_code == 200, (case.id, row.text)
                assert row.json()["model"]["weights_sha256"] == sha, case.id
                assert row.json()["calibration_mc_samples"] == 20, case.id
                meta = await client.get(f"/v2/models/{name}")
                assert meta.status_code == 200, (case.id, meta.text)
                assert meta.json()["outputs"][0]["shape"] == [-1, 10], (case.id, meta.json())
            finally:
                (store / case.file).write_bytes(original)
        restored = await client.post("/admin/reload", headers=headers)
        assert restored.status_code == 200, restored.text
        assert restored.json()["weights_sha256"] == sha


def test_a_detector_that_cannot_score_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files consistent with each other whose statistics do not fit the network's features
    failed only in the warm-up batch (exit 3) or the first request; the load check runs two
    blank images through the served path and names detector.json."""
    from bayesgate.models.detection.detector import Detector

    served = load_served_model(BUNDLED, "cpu")  # the bundled model answers blank images
    assert served.detector is not None
    state = torch.get_rng_state()
    check_answers(served)
    assert torch.equal(state, torch.get_rng_state())  # the check draws from its own generator

    def misfit(*_: object, **__: object) -> None:
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x256 and 128x10)")

    monkeypatch.setattr(Detector, "scores", misfit)
    with pytest.raises(StartupError) as info:
        load_served_model(BUNDLED, "cpu")
    assert str(info.value) == (
        f"{BUNDLED / 'detector.json'}: the model cannot answer a blank image "
        "(mat1 and mat2 shapes cannot be multiplied (2x256 and 128x10))"
    )
    monkeypatch.setattr("bayesgate.service.cli.run_uvicorn", misfit)  # never reached
    assert main(["serve", "--model-dir", str(BUNDLED), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bayesgate: error: ") and "cannot answer a blank image" in err
