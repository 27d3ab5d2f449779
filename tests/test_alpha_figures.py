"""bench/alpha_figures.py: Figures 4–5 (test error and LL against α) from the long runs."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
from bench_scripts import load_bench, run_bayesgate


def _result(group: str, seed: int, accuracy: float, ll: float, converged: bool = True) -> dict:
    det = group == "det"
    return {
        "model": f"m-{group}-{seed}", "accuracy": accuracy, "log_likelihood": ll,
        "stochastic": not det, "weights_sha256": "0" * 64,
        "training": {"alpha": 0.5 if det else float(group), "seed": seed, "best_epoch": 7,
                     "epochs_run": 17},
        "run": {"converged": converged},
    }  # fmt: skip


def test_mean_and_standard_error_match_the_textbook_formula() -> None:
    figures = load_bench("alpha_figures")
    mean, se = figures.mean_se([1.0, 2.0, 3.0])  # s = 1 (n − 1), s.e. = 1/√3
    assert mean == 2.0 and se == pytest.approx(1 / math.sqrt(3))
    assert figures.mean_se([0.25]) == (0.25, None)


def test_summary_groups_by_alpha_with_the_baseline_last() -> None:
    figures = load_bench("alpha_figures")
    results = [
        _result("det", 0, 0.98, -0.07),
        _result("0.5", 1, 0.99, -0.03, converged=False),
        _result("0.5", 0, 0.97, -0.05),
        _result("0", 0, 0.985, -0.04),
    ]
    rows = figures.summarise(results)
    assert [r.group for r in rows] == ["0", "0.5", "det"]
    half = rows[1]
    assert (half.n, half.converged) == (2, 1)
    assert half.error_mean == pytest.approx(2.0) and half.error_se == pytest.approx(1.0)
    assert half.ll_mean == pytest.approx(-0.04) and half.ll_se == pytest.approx(0.01)
    assert rows[0].error_se is None
    text = figures.table(rows)
    assert "| α = 0.5 | 2 | 2.00 ± 1.00 | -0.0400 ± 0.0100 | 1/2 | 7/17, 7/17 |" in text
    assert "| deterministic | 1 | 2.00 | -0.0700 | 1/1 |" in text


def test_evaluate_and_plot_from_finished_and_running_runs(
    private_user_cache: Path, mnist_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A finished run is evaluated from its model directory, a run still going (``--partial``)
    from an export of its checkpoint and marked not converged; the plot writes the PNG, the
    table and one CSV row per model, and a second ``evaluate`` reuses the JSON of the same
    weights."""
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    monkeypatch.delitem(sys.modules, "long_runs", raising=False)  # its cache: the private one
    figures = load_bench("alpha_figures")
    long_runs = sys.modules["long_runs"]
    assert long_runs.CACHE.is_relative_to(private_user_cache)
    common = ("--k-val", "2", "--epochs", "4", "--limit", "256", "--val-size", "500",
              "--keep-best", "--patience", "10", "--no-progress")  # fmt: skip
    runs = [
        long_runs.Run("mlp-2x100-tiny-alpha0.5", "train",
                      ("--preset", "mlp-2x32", "--alpha", "0.5", "--k-train", "2", *common), 17),
        long_runs.Run("mlp-2x100-tiny-det", "train",
                      ("--preset", "mlp-2x32-det", "--k-train", "1", *common), 17),
    ]  # fmt: skip
    monkeypatch.setattr(long_runs, "RUNS", {run.name: run for run in runs})
    bayesgate = str(Path(sys.executable).with_name("bayesgate"))
    run_bayesgate(runs[0].argv(bayesgate))  # all 4 epochs
    partial = long_runs.export_argv(runs[1], bayesgate, runs[1].checkpoint, runs[1].out, 2)
    run_bayesgate(partial)  # 2 of 4: still "running"
    assert long_runs.finished(runs[0]) and not long_runs.finished(runs[1])

    out = tmp_path / "figure4"
    assert figures.main(["evaluate", "4", "--out", str(out), "--k", "2"]) == 0
    assert sorted(p.name for p in out.glob("*.json")) == ["mlp-2x100-tiny-alpha0.5.json"]
    assert figures.main(["evaluate", "4", "--out", str(out), "--k", "2", "--partial"]) == 0
    det = json.loads((out / "mlp-2x100-tiny-det.json").read_text())
    assert det["stochastic"] is False and det["run"]["converged"] is False
    assert det["training"]["epochs_run"] == 2 and det["k"] == 2
    first = (out / "mlp-2x100-tiny-alpha0.5.json").stat().st_mtime_ns
    assert figures.main(["evaluate", "4", "--out", str(out), "--k", "2"]) == 0
    assert (out / "mlp-2x100-tiny-alpha0.5.json").stat().st_mtime_ns == first

    assert figures.main(["plot", "4", "--out", str(out)]) == 0
    assert (out / "figure4.png").stat().st_size > 5000
    rows = list(csv.DictReader((out / "figure4.csv").open()))
    assert [(r["alpha_or_det"], r["converged"]) for r in rows] == [
        ("0.5", "False"),  # ended at its --epochs cap, not by its patience
        ("det", "False"),
    ]
    alpha = json.loads((out / "mlp-2x100-tiny-alpha0.5.json").read_text())
    assert float(rows[0]["test_error_pct"]) == pytest.approx(100 * (1 - alpha["accuracy"]))
    assert "| α = 0.5 | 1 |" in (out / "figure4.md").read_text()


def test_plot_without_evaluations_says_what_to_run(tmp_path: Path, capsys) -> None:
    figures = load_bench("alpha_figures")
    assert figures.main(["plot", "5", "--out", str(tmp_path)]) == 2
    assert "run `evaluate 5` first" in capsys.readouterr().err


def test_each_figure_is_made_of_its_own_runs_only() -> None:
    """Figure 5 is the Keras-example CNN at α ∈ {0, 0.5, 1} and its deterministic twin, three
    seeds each — not the adversarially trained wide CNN; Figure 4 the 2×100 MLP likewise."""
    figures = load_bench("alpha_figures")
    for figure, preset in ((4, "mlp-2x100"), (5, "cnn")):
        runs = figures.figure_runs(figure)
        assert len(runs) == 12, [r.name for r in runs]
        presets = {r.flags[r.flags.index("--preset") + 1] for r in runs}
        assert presets == {preset, f"{preset}-det"}
    runs = figures.figure_runs(
        6
    )  # the 3×1000 MLP of Figures 6–7: α ∈ {0, 0.5, 1} and det, one seed
    assert {r.flags[r.flags.index("--preset") + 1] for r in runs} == {
        "mlp-3x1000",
        "mlp-3x1000-det",
    }
    assert sorted(r.name for r in runs) == sorted(
        f"mlp-3x1000-{g}-long" for g in ("alpha0", "alpha0.5", "alpha1", "det")
    )
