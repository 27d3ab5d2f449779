"""bench/verdict_k_cost.py on a tiny CNN with a detector: more passes cost more."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bayesgate.attacks.detector_fit import FitSettings, fit_detector
from bayesgate.models.detection.store import save_detector
from bayesgate.models.store.directory import load_model
from tests.bench_scripts import load_bench

bench = load_bench("verdict_k_cost")


def test_cost_grows_with_k(
    tiny_cnn_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = Path(shutil.copytree(tiny_cnn_dir, tmp_path / "model"))
    fit = FitSettings(k=5, attacks=("fgs:eta=0.2",), train_subset=600, fit_images=200,
                      threshold_images=200, attack_images=50, kde_per_class=20)  # fmt: skip
    save_detector(fit_detector(load_model(out), fit), out)
    ms = bench.measure(out, [2, 64], batch=8, repeats=5, warmup=1)
    assert set(ms) == {2, 64} and 0 < ms[2] < ms[64]
    assert bench.main(["--model", str(out), "--k", "2", "4", "--batch", "4", "--repeats", "2"]) == 0
    assert "1.00× K = 2" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--model", str(out), "--k", "0"])
