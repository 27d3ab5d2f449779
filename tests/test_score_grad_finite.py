"""bench/score_grad_finite.py: the detector score's input gradient is finite on digits whose
softmax underflows (the count it prints is 0 on the first 20 test digits of bayesgate-cnn, the
model where e7c2644's entropy gave NaN on ~10 % of digits)."""

from __future__ import annotations

import sys

import pytest
from bench_scripts import load_bench


def test_the_bench_counts_no_non_finite_gradient(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("score_grad_finite")
    argv = ["score_grad_finite.py", "--model", "bayesgate-cnn", "--n", "20", "--k", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    assert capsys.readouterr().out.strip() == (
        "bayesgate-cnn: 0 of 20 digits with a non-finite gradient of fused"
    )
