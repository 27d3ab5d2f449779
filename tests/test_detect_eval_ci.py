"""bench/detect_eval_ci.py: n, Wilson intervals and AUROC errors of a detect-eval result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_scripts import load_bench


def _module():
    return load_bench("detect_eval_ci")


def test_wilson_and_hanley_mcneil() -> None:
    ci = _module()
    lo, hi = ci.wilson(20, 20)
    assert hi == 1.0 and lo == pytest.approx(20 / (20 + ci.Z95**2))  # k = n: n / (n + z²)
    lo, hi = ci.wilson(50, 100)
    assert lo == pytest.approx(1 - hi) and lo == pytest.approx(0.4038, abs=1e-4)
    assert ci.hanley_mcneil_se(1.0, 20, 1000) == 0.0  # no error bar at a perfect separation
    # A = 0.5: Q1 = Q2 = 1/3, so SE² = (1/4 + (n1 + n0 − 2)/12) / (n1·n0)
    expected = math.sqrt((0.25 + (30 + 1000 - 2) / 12) / (30 * 1000))
    assert ci.hanley_mcneil_se(0.5, 30, 1000) == pytest.approx(expected)
    assert ci.hanley_mcneil_se(0.9, 20, 1000) > ci.hanley_mcneil_se(0.9, 200, 1000)


def test_rows_of_a_result(tmp_path: Path) -> None:
    ci = _module()
    score = {"auroc": 0.95, "tpr_at_threshold": 0.8}
    result = {
        "model": "m",
        "images": 100,
        "clean_test_fpr": {"predictive_entropy": 0.06, "fused": 0.05},
        "rows": [
            {"set": "fgs", "label": "FGS", "kind": "attack", "images": 100, "eligible": 99,
             "successful": 5, "scores": {"predictive_entropy": score, "fused": score}},
            {"set": "ood:x", "label": "X", "kind": "ood", "images": 100,
             "scores": {"predictive_entropy": score, "fused": score}},
        ],
    }  # fmt: skip
    path = tmp_path / "detect_eval.json"
    path.write_text(json.dumps(result))
    ci.main([str(path), "--out", str(tmp_path / "ci.json")])
    out = json.loads((tmp_path / "ci.json").read_text())
    fgs, ood = out["rows"]
    assert (fgs["n"], fgs["eligible"], ood["n"]) == (5, 99, 100)
    assert fgs["fused"]["flagged_k"] == 4 and fgs["fused"]["auroc_resolution"] == 0.2
    assert fgs["fused"]["evaded"] == 1 and fgs["fused"]["evaded_of_eligible"] == round(1 / 99, 4)
    assert "evaded" not in ood["fused"]
    assert out["clean_test_fpr"]["fused"]["k"] == 5
    assert out["command"].startswith("python bench/detect_eval_ci.py ")
