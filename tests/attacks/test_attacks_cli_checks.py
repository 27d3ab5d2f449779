"""Every check of a user's input runs before the long work of a command (attack, evaluation,
feature extraction) and is a one-line error (exit code 2) naming the flag and the value.

The work functions are replaced by ones that fail the test if reached: the error must come
first, not after a run that could last hours."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bayesgate.attacks import cli as attacks_cli
from bayesgate.attacks import evaluate_cli, robust_cli, robust_eval
from bayesgate.attacks.adaptive import AdaptivePGD
from bayesgate.attacks.adaptive_eval import AdaptiveSettings
from bayesgate.attacks.detect_eval import EvalSettings
from bayesgate.attacks.detector_fit import FitSettings
from bayesgate.attacks.pipeline import detection_run
from bayesgate.cli import main
from bayesgate.errors import InvalidArgument
from tests.cli_checks import never as _never
from tests.cli_checks import one_error_line as _error


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.touch()
    return path


# --- 1. output paths, checked before the work ------------------------------------------------


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("afile/a.npz", "cannot create"),  # a file where a folder must be
        ("adv.txt", "must end in .npz"),
        ("folder.npz", "is a folder, not a file"),
    ],
)
def test_attack_checks_its_out_file_first(
    out: str,
    message: str,
    afile: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("bayesgate.attacks.run.run_attack", _never)
    (afile.parent / "folder.npz").mkdir()
    path = afile.parent / out
    argv = ["attack", str(tiny_model_dir), "--out", str(path), "--limit", "2", "--no-progress"]
    assert main(argv) == 2
    err = _error(capsys)
    assert err.startswith(f"--out {path}: ") and message in err


def test_sweep_checks_its_out_folder_first(
    afile: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(attacks_cli, "_run_sweep", _never)
    monkeypatch.setattr(attacks_cli, "_sweep_images", _never)
    argv = ["sweep", str(tiny_model_dir), "--figure", "6", "--limit", "3", "--out", str(afile)]
    assert main(argv) == 2
    assert _error(capsys) == f"--out {afile}: is a file, not a folder"


@pytest.mark.parametrize("command", ["detect-eval", "adaptive-eval", "evaluate-robust"])
def test_evaluations_check_their_out_folder_first(
    command: str,
    afile: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    monkeypatch.setattr(robust_cli, "load_for_evaluation", _never)
    monkeypatch.setattr(robust_eval, "evaluate_robust", _never)
    assert main([command, str(tiny_model_dir), "--out", str(afile)]) == 2
    assert _error(capsys) == f"--out {afile}: is a file, not a folder"


@pytest.mark.parametrize("command", ["detect-eval", "adaptive-eval"])
def test_evaluations_check_their_cache_dir_first(
    command: str,
    afile: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    out = afile.parent / "out"
    assert main([command, str(tiny_model_dir), "--out", str(out), "--cache-dir", str(afile)]) == 2
    assert _error(capsys) == f"--cache-dir {afile}: is a file, not a folder"


# --- 2, 3. adaptive-eval and evaluate-robust's adaptive flags --------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--eps", "2", "--eps must be in (0, 1], got 2.0"),
        ("--eps", "-0.1", "--eps must be in (0, 1], got -0.1"),
        ("--eps", "nan", "--eps must be in (0, 1], got nan"),
        ("--weights", "-1", "--weights must be a finite number ≥ 0, got -1.0"),
        ("--weights", "inf", "--weights must be a finite number ≥ 0, got inf"),
        ("--joint-weights", "nan", "--joint-weights must be a finite number ≥ 0, got nan"),
        ("--steps", "0", "--steps must be ≥ 1, got 0"),
        ("--delta", "-5", "--delta must be a finite number ≥ 0, got -5.0"),
        ("--kappa", "nan", "--kappa must be a finite number ≥ 0, got nan"),
        ("--restarts", "0", "--restarts must be ≥ 1, got 0"),
        ("--eps", ",", "--eps: give at least one radius"),
    ],
)
def test_adaptive_eval_names_the_bad_flag(
    flag: str,
    value: str,
    message: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    argv = ["adaptive-eval", str(tiny_model_dir), "--out", str(tmp_path / "ae"), flag, value]
    assert main(argv) == 2
    assert _error(capsys) == message


def test_the_adaptive_attack_refuses_non_finite_parameters() -> None:
    for bad in ({"kappa": math.nan}, {"eps": math.nan}, {"weight": math.inf}, {"delta": -1.0}):
        with pytest.raises(InvalidArgument):
            AdaptivePGD(**bad)
    with pytest.raises(InvalidArgument, match="adaptive eps"):
        AdaptiveSettings(eps=(2.0,))  # when the settings are made, not midway through the run
    with pytest.raises(InvalidArgument, match="adaptive kappa"):
        AdaptiveSettings(kappa=math.nan)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--adaptive-weights", "-1"], "--adaptive-weights must be finite numbers ≥ 0, got -1.0"),
        (["--adaptive-weights", "1,nan"], "--adaptive-weights must be finite numbers ≥ 0, got nan"),
        (["--eps", ","], "give at least one eps"),  # `x` instead of a number: tests/test_cli_lists
        (["--adaptive-steps", "0"], "--adaptive-steps must be ≥ 1, got 0"),
        # 5, 6: no attack; the step counts named with their flag
        (["--attacks", ""], "give at least one attack (pgd, apgd-ce, apgd-dlr)"),
        (["--attacks", ","], "give at least one attack (pgd, apgd-ce, apgd-dlr)"),
        (["--restarts", "0"], "--restarts must be ≥ 1, got 0"),
        (["--pgd-steps", "-1"], "--pgd-steps must be ≥ 1, got -1"),
        (["--apgd-steps", "0"], "--apgd-steps must be ≥ 1, got 0"),
        (["--k-eval", "0"], "--k-eval must be ≥ 1, got 0"),
    ],
)
def test_evaluate_robust_checks_its_flags_first(
    args: list[str],
    message: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(robust_cli, "load_for_evaluation", _never)
    monkeypatch.setattr(robust_eval, "evaluate_robust", _never)
    argv = ["evaluate-robust", str(tiny_model_dir), "--out", str(tmp_path / "er"), *args]
    assert main(argv) == 2
    assert _error(capsys) == message


# --- 7. every model of evaluate-robust is loaded before the first evaluation -----------------


def test_evaluate_robust_loads_every_model_first(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(robust_eval, "evaluate_robust", _never)
    missing = tmp_path / "nonexistent"
    argv = ["evaluate-robust", str(tiny_model_dir), str(missing), "--out", str(tmp_path / "er")]
    assert main(argv) == 2
    assert str(missing) in _error(capsys)


# --- 4. fit-detector --shrinkage: fit_class_gaussians' rule, before the model is loaded -------


@pytest.mark.parametrize("value", ["5", "nan", "-0.1", "inf"])
def test_fit_detector_checks_shrinkage_first(
    value: str,
    model_copy: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("bayesgate.models.store.directory.load_model", _never)
    monkeypatch.setattr("bayesgate.attacks.detector_fit.fit_detector", _never)
    assert main(["fit-detector", str(model_copy), "--shrinkage", value, "--no-progress"]) == 2
    err = _error(capsys)
    assert err.startswith("shrinkage must be in [0, 1]") and err.endswith(f"got {float(value)}")


def test_fit_settings_accept_the_shrinkages_the_fit_accepts() -> None:
    for ok in (None, 0.0, 0.3, 1.0):
        FitSettings(shrinkage=ok).check()
    with pytest.raises(InvalidArgument, match="l2"):
        FitSettings(l2=math.nan).check()


# --- 8. sweep --slow-limit / --cw-limit below 1 ----------------------------------------------


@pytest.mark.parametrize(("flag", "value"), [("--slow-limit", "-1"), ("--cw-limit", "0")])
def test_sweep_rejects_a_slow_limit_below_one(
    flag: str,
    value: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(attacks_cli, "_run_sweep", _never)
    monkeypatch.setattr(attacks_cli, "_sweep_images", _never)
    argv = ["sweep", str(tiny_model_dir), "--figure", "detection", "--out", str(tmp_path), flag]
    assert main([*argv, value]) == 2
    assert _error(capsys) == f"--slow-limit must be ≥ 1, got {value}"


def test_detection_run_rejects_a_slow_limit_below_one() -> None:
    x, y = torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long)
    with pytest.raises(InvalidArgument, match="slow_limit must be ≥ 1, got -1"):
        detection_run(_never, x, y, [], k_attack=1, k_eval=1, slow_limit=-1)


# --- 9. detect-eval --attack-limit must name an attack of the run ----------------------------


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ("CW=2", "--attack-limit CW=2: no attack 'CW' in this run (its attacks: fgs, cw)"),
        ("pgd=2", "--attack-limit pgd=2: no attack 'pgd' in this run (its attacks: fgs, cw)"),
        ("cw=0", "--attack-limit cw=0: must be ≥ 1"),
    ],
)
def test_detect_eval_attack_limit_names_an_attack_of_the_run(
    limit: str,
    message: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(evaluate_cli, "_load", _never)
    argv = ["detect-eval", str(tiny_model_dir), "--out", str(tmp_path / "de"), "--attacks",
            "fgs:eta=0.1", "fgs:eta=0.2", "cw:iterations=1,binary_steps=1", "--ood", "uniform",
            "--attack-limit", limit]  # fmt: skip
    assert main(argv) == 2
    assert _error(capsys) == message


def test_eval_settings_accept_a_limit_of_an_attack_of_the_run() -> None:
    EvalSettings(attacks=("cw:iterations=1",), attack_limits={"cw": 3}).check()
    with pytest.raises(InvalidArgument, match="its attacks: none"):
        EvalSettings(attacks=(), attack_limits={"cw": 3}).check()
