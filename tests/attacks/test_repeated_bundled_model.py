"""A model given twice to a command that takes several (``sweep``, ``evaluate-robust``) is named
in the one error line as the user gave it: a bundled model's name, not the directory inside the
package that the name stands for (which follows in parentheses)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bayesgate.attacks import cli as attacks_cli
from bayesgate.attacks import robust_cli, robust_eval
from bayesgate.cli import main
from bayesgate.models.store.bundled import BUNDLED_MODELS_DIR, DEFAULT_MODEL_DIR
from tests.cli_checks import never, one_error_line

ROBUST = BUNDLED_MODELS_DIR / "bayesgate-robust"


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither command loads or attacks a model: the check comes first."""
    monkeypatch.setattr(attacks_cli, "_run_sweep", never)
    monkeypatch.setattr(attacks_cli, "_sweep_images", never)
    monkeypatch.setattr(robust_cli, "load_for_evaluation", never)
    monkeypatch.setattr(robust_eval, "evaluate_robust", never)


def _argv(command: str, models: list[str], out: Path) -> list[str]:
    if command == "sweep":
        return ["sweep", *models, "--figure", "6", "--out", str(out)]
    return ["evaluate-robust", *models, "--out", str(out)]


@pytest.mark.parametrize("command", ["sweep", "evaluate-robust"])
def test_a_bundled_name_given_twice_is_named_as_given(
    command: str, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(_argv(command, ["bayesgate-robust", "bayesgate-robust"], out)) == 2
    line = one_error_line(capsys)
    assert line == f"model bayesgate-robust ({ROBUST}) given twice: give each model once"
    assert not out.exists()


@pytest.mark.parametrize("command", ["sweep", "evaluate-robust"])
def test_two_names_of_one_bundled_model_are_both_named(
    command: str, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bayesgate-default`` is another name of the bundled default model."""
    assert DEFAULT_MODEL_DIR == ROBUST
    out = tmp_path / "out"
    assert main(_argv(command, ["bayesgate-robust", "bayesgate-default"], out)) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"model bayesgate-default ({ROBUST}) given twice")
    assert "(as bayesgate-robust and bayesgate-default)" in line
    assert not out.exists()


def test_a_directory_given_twice_is_still_named_as_a_directory(
    tiny_model_dir: Path, tmp_path: Path, no_work: None, capsys: pytest.CaptureFixture[str]
) -> None:
    models = [str(tiny_model_dir), str(tiny_model_dir)]
    assert main(_argv("sweep", models, tmp_path / "out")) == 2
    assert one_error_line(capsys) == (
        f"model directory {tiny_model_dir} given twice: give each model once"
    )
