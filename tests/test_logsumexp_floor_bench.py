"""bench/logsumexp_floor.py on a few digits of the bundled model: its score comparison finds no
difference with the floor kde.py uses, and does find them when the floor is too high to be exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_scripts import load_bench

from bayesgate.models.detection import kde

ARGS = [
    "--batch",
    "4",
    "--limit",
    "12",
    "--single-limit",
    "3",
    "--rounds",
    "1",
    "--seconds",
    "0.02",
]


def test_the_floor_changes_no_score_and_the_timings_are_recorded(tmp_path: Path) -> None:
    bench = load_bench("logsumexp_floor")
    assert bench.main([*ARGS, "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())
    same = out["same_scores"]
    assert same["images"] == 15
    assert {"fused", "neg_log_kde", "predictive_entropy"} <= set(same["mismatched_by_score"])
    assert sum(same["mismatched_by_score"].values()) == 0
    assert out["kernel_terms"]["shape"] == [4, 500]
    assert 0 < out["kernel_terms"]["share_underflowing"] <= 1
    for timing in ("exp_us", "logsumexp_us", "answers_us"):
        assert all(v > 0 for v in out[timing].values())
    with bench.plain():
        assert kde.logsumexp_rows is bench.plain_logsumexp_rows
    assert kde.logsumexp_rows is not bench.plain_logsumexp_rows


def test_a_floor_too_close_to_the_maximum_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_bench("logsumexp_floor")
    monkeypatch.setattr(kde, "EXP_FLOOR", 3.0)  # e^−3 is not negligible beside 1
    assert bench.main(ARGS) == 1
