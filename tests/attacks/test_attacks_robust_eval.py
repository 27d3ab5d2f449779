"""``evaluate-robust``: writes the table, JSON and plot for a tiny model and a few digits; the
worst-of accuracy is the per-digit conjunction; a second run reads every batch from the cache;
a training checkpoint is evaluated like a model directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bayesgate.attacks import robust_eval
from bayesgate.attacks.robust_eval import RobustSettings, _eps_row
from bayesgate.cli import main

FAST = ["--n", "12", "--eps", "0.05,0.2", "--pgd-steps", "4", "--restarts", "2",
        "--apgd-steps", "5", "--k-attack", "2", "--k-eval", "5", "--batch-size", "8",
        "--no-progress", "--threads", "1"]  # fmt: skip


def test_worst_of_is_the_per_digit_conjunction() -> None:
    clean = np.array([True, True, True, True, False])
    fooled = {
        "pgd": np.array([True, False, False, False, False]),
        "apgd-ce": np.array([False, True, False, False, False]),
        "apgd-dlr": np.array([False, False, False, False, False]),
    }
    row = _eps_row(0.3, clean, fooled, RobustSettings())
    assert row["robust_accuracy"] == {"PGD-100 × 5": 0.6, "APGD-CE-100": 0.6, "APGD-DLR-100": 0.8}
    assert row["robust_accuracy_worst_of"] == pytest.approx(0.4)  # digits 2 and 3 only


def test_the_batch_cache_round_trips_and_leaves_only_its_arrays(tmp_path: Path) -> None:
    cache = robust_eval.BatchCache(tmp_path, "tiny-0123456789ab")
    value = np.array([True, False, True])
    assert cache.get("pgd-eps0.3-b0") is None
    cache.put("pgd-eps0.3-b0", value)
    cache.put("pgd-eps0.3-b0", value)  # a batch written again replaces its file
    assert np.array_equal(cache.get("pgd-eps0.3-b0"), value)
    assert [p.name for p in cache.dir.iterdir()] == ["pgd-eps0.3-b0.npy"]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown attacks"):
        RobustSettings(attacks=("fgsm",))
    with pytest.raises(ValueError, match="eps"):
        RobustSettings(eps=(0.0,))


def test_evaluate_robust_writes_the_table_and_resumes_from_its_cache(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "robust"
    assert main(["evaluate-robust", str(tiny_model_dir), "--out", str(out), *FAST]) == 0
    # the table it wrote is printed (as the README promises), then the files
    printed, files = capsys.readouterr().out.split("\n\n{", 1)
    assert printed + "\n" == (out / "robust.md").read_text()
    assert json.loads("{" + files)["markdown"] == str(out / "robust.md")
    result = json.loads((out / "robust.json").read_text())
    (model,) = result["models"]
    assert model["images"] == 12 and [r["eps"] for r in model["eps"]] == [0.05, 0.2]
    for row in model["eps"]:
        assert set(row["robust_accuracy"]) == {"PGD-4 × 2", "APGD-CE-5", "APGD-DLR-5"}
        worst = row["robust_accuracy_worst_of"]
        assert worst <= min(row["robust_accuracy"].values()) <= model["clean_accuracy"]
    small, large = model["eps"]
    assert large["robust_accuracy_worst_of"] < model["clean_accuracy"]  # the attacks bite
    assert large["robust_accuracy_worst_of"] <= small["robust_accuracy_worst_of"]
    table = (out / "robust.md").read_text()
    assert table.startswith("| model | ε | n | clean acc | PGD-4 × 2 | APGD-CE-5 | APGD-DLR-5 |")
    assert f"| {model['name']} | 0.2 | 12 |" in table
    assert (out / "robust.png").stat().st_size > 1000

    def no_attacks(eps: float, settings: RobustSettings) -> dict:
        raise AssertionError("an attack was built although every batch is cached")

    monkeypatch.setattr(robust_eval, "attacks_at", no_attacks)
    again = tmp_path / "again"
    (again / "cache").parent.mkdir(parents=True)
    (again / "cache").symlink_to(out / "cache")
    assert main(["evaluate-robust", str(tiny_model_dir), "--out", str(again), *FAST]) == 0
    assert json.loads((again / "robust.json").read_text())["models"] == result["models"]


def test_a_training_checkpoint_is_evaluated_too(
    mnist_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    ckpt = tmp_path / "ckpt"
    assert main(["train", "--preset", "mlp-2x32", "--limit", "500", "--val-size", "0",
                 "--epochs", "1", "--lr", "1e-2", "--k-train", "2", "--checkpoint-dir", str(ckpt),
                 "--out", str(tmp_path / "model"), "--no-progress"]) == 0  # fmt: skip
    out = tmp_path / "robust"
    assert main(["evaluate-robust", str(ckpt), "--out", str(out), *FAST]) == 0
    (model,) = json.loads((out / "robust.json").read_text())["models"]
    assert model["name"] == "ckpt (checkpoint, epoch 1)"
    assert model["clean_accuracy"] > 0.3  # the trained weights, not a fresh net (≈ 0.1)


def test_a_bad_eps_is_a_one_line_error(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:  # argparse's own error, one line
        main(["evaluate-robust", str(tiny_model_dir), "--out", str(tmp_path), "--eps", "0.1,big"])
    assert info.value.code == 2
    assert "argument --eps: invalid float value: 'big'" in capsys.readouterr().err


def test_the_adaptive_step_runs_against_a_fitted_detector(model_copy: Path, tmp_path: Path) -> None:
    from bayesgate.attacks.robust_adaptive import NO_DETECTOR
    from bayesgate.models.store.calibration import Calibration, write_calibration
    from bayesgate.models.store.directory import load_model

    out = tmp_path / "robust"
    assert main(["evaluate-robust", str(model_copy), "--out", str(out), "--eps", "0.2",
                 *FAST[4:], "--n", "12", "--adaptive-steps", "3",
                 "--adaptive-weights", "1"]) == 0  # fmt: skip
    (model,) = json.loads((out / "robust.json").read_text())["models"]
    assert model["adaptive"] == {"status": NO_DETECTOR}

    sha = load_model(model_copy).card.weights_sha256
    write_calibration(Calibration(sha, "predictive_entropy", 0.05, 5, {"predictive_entropy": 1.0}),
                      model_copy)  # fmt: skip
    fit = ["--train-subset", "600", "--fit-images", "200", "--threshold-images", "200",
           "--attack-images", "40", "--kde-per-class", "20", "--k", "5", "--threads", "1",
           "--attacks", "fgs:eta=0.2", "--no-progress"]  # fmt: skip
    assert main(["fit-detector", str(model_copy), *fit]) == 0
    assert main(["evaluate-robust", str(model_copy), "--out", str(out), "--eps", "0.2",
                 *FAST[4:], "--n", "12", "--adaptive-steps", "3",
                 "--adaptive-weights", "1"]) == 0  # fmt: skip
    (model,) = json.loads((out / "robust.json").read_text())["models"]
    adaptive = model["adaptive"]
    assert adaptive["status"] == "ran" and set(adaptive["by_eps"]) == {"0.2"}
    rows = adaptive["detail"]["rows"]
    assert [r["attack"] for r in rows] == ["plain PGD", "adaptive λ=1"]
    assert adaptive["by_eps"]["0.2"] == max(r["evaded_rate"] for r in rows)
    assert 0.0 <= adaptive["clean_fpr"] <= 1.0
    line = next(x for x in (out / "robust.md").read_text().splitlines() if "| 0.2 | 12 |" in x)
    assert line.split(" | ")[-2] == f"{100 * adaptive['by_eps']['0.2']:.1f} %"


@pytest.mark.parametrize("eps", ["0.1,,0.2", "0.1,", "0.1,x"])
def test_an_empty_or_bad_eps_item_is_an_error(
    eps: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--eps 0.1,,0.2`` was read as ``0.1,0.2``: a typo that silently dropped a radius."""
    with pytest.raises(SystemExit) as info:  # argparse's own error, one line
        main(["evaluate-robust", str(tmp_path / "m"), "--out", str(tmp_path), "--eps", eps])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.count("\n") == 0
    problem = "invalid float value: 'x'" if eps.endswith("x") else f"empty item in {eps!r}"
    assert err.startswith(f"bayesgate evaluate-robust: error: argument --eps: {problem}")
