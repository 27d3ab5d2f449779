"""bench/adaptive_union.py: the attacker's choice per digit (the first attack its own query saw get
through), each attack's count equal to adaptive-eval's ``evaded``, and the combined attacker's
count equal to the chosen attacks' verdicts digit by digit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from adaptive_images import slide_on_the_cnn
from bench_scripts import load_bench

LIMIT = 40


def test_choose_takes_the_first_file_found_else_the_last() -> None:
    bench = load_bench("adaptive_union")
    found = [np.array([False, True, False, True]), np.array([True, True, False, False])]
    assert bench.choose(found).tolist() == [1, 0, 1, 0]


def test_counts_are_adaptive_evals_and_the_choice_is_the_attackers(
    tmp_path: Path, mnist_root: Path, monkeypatch
) -> None:
    monkeypatch.setenv("BAYESGATE_DATA_DIR", str(mnist_root))
    run = slide_on_the_cnn(tmp_path / "cache", LIMIT)
    adaptive, plain = run.adaptive, run.plain
    plain_row, adaptive_row = run.plain_row, run.adaptive_row
    out = tmp_path / "union.json"
    bench = load_bench("adaptive_union")
    argv = [str(run.model), "--images", str(adaptive), str(plain), "--limit", str(LIMIT),
            "--json", str(out)]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads(out.read_text())

    first, second = result["files"]
    assert first["through"] == adaptive_row["evaded"] > 0
    assert second["through"] == plain_row["evaded"]
    assert result["eligible"] == adaptive_row["eligible"]
    with np.load(adaptive) as data:
        found = data["found"].astype(bool)
    assert (first["sent"], second["sent"]) == (int(found.sum()), LIMIT - int(found.sum()))
    assert result["some_file_through"] >= max(first["through"], second["through"])
    assert result["attacker_through"] <= result["some_file_through"]
    assert result["attacker_through"] == result["chosen_files_through"]
    assert result["misclassified_sent"] >= result["attacker_through"]
