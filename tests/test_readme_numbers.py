"""bench/check_readme_numbers.py: the committed MNIST raw outputs re-derive the README headline
and the docs/models.md table; a changed number or a row without raw output is reported."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checker():
    spec = importlib.util.spec_from_file_location(
        "check", REPO / "bench" / "check_readme_numbers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_docs_agree_with_their_raw_outputs(checker, capsys) -> None:
    assert checker.main(["--root", str(REPO)]) == 0, capsys.readouterr().err
    results = checker.load_results(REPO / "docs" / "mnist")
    assert checker.BUNDLED in results
    for name, result in results.items():
        assert result["k"] == 100 and result["split"] == "test" and result["images"] == 10_000
        assert (
            result["command"].startswith("bayesgate evaluate ") and "--seed 0" in result["command"]
        ), name


def _copy_repo_docs(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copy(REPO / "docs" / "models.md", tmp_path / "docs" / "models.md")
    shutil.copytree(REPO / "docs" / "mnist", tmp_path / "docs" / "mnist")
    return tmp_path


def test_a_changed_number_is_reported(checker, tmp_path: Path, capsys) -> None:
    root = _copy_repo_docs(tmp_path)
    path = root / "docs" / "mnist" / f"{checker.BUNDLED}.json"
    result = json.loads(path.read_text())
    result["accuracy"] -= 0.0010  # 0.10 points lower than the docs say
    result["ece"] += 0.0100
    path.write_text(json.dumps(result))
    assert checker.main(["--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"{checker.BUNDLED} accuracy" in err and f"{checker.BUNDLED} ece" in err
    assert "README.md: headline" in err and "candidates table" in err


def test_a_row_without_raw_output_is_reported(checker, tmp_path: Path, capsys) -> None:
    root = _copy_repo_docs(tmp_path)
    (root / "docs" / "mnist" / f"{checker.BUNDLED}.json").unlink()
    assert checker.main(["--root", str(root)]) == 1
    assert f"{checker.BUNDLED} has no raw output" in capsys.readouterr().err


def test_expected_row_formatting(checker) -> None:
    result = {
        "accuracy": 0.98765,
        "log_likelihood": -0.043219,
        "brier": 0.0199949,
        "ece": 0.00551,
        "training": {"alpha": 0.5, "k_train": 10, "epochs_run": 12, "seconds": 2784.9},
    }
    assert checker.expected_row(result) == {
        "α": "0.5",
        "K train": "10",
        "epochs": "12",
        "accuracy": "98.77",
        "log_likelihood": "-0.0432",
        "brier": "0.0200",
        "ece": "0.0055",
        "train min": "46",
    }
    det = {**result, "stochastic": False}  # a deterministic baseline: no α
    assert checker.expected_row(det)["α"] == "–"
    assert checker.number("**−0.0351**") == -0.0351
