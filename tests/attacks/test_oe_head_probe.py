"""bench/oe_head_probe.py: the outlier term, the fine-tuning and a whole run on a tiny CNN."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from bayesgate.models.mc.dropout import MCDropout
from tests.bench_scripts import load_bench

probe = load_bench("oe_head_probe")


def test_outlier_term_is_the_cross_entropy_from_uniform_to_the_mc_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    log_p = torch.log_softmax(torch.randn(4, 3, 5, generator=gen), dim=-1)
    p_bar = log_p.exp().mean(dim=1)  # B×C
    expected = float((-(p_bar.log()).mean(dim=-1)).mean())
    assert float(probe.outlier_term(log_p)) == pytest.approx(expected, rel=1e-5)
    uniform = torch.full((2, 3, 5), -math.log(5))
    assert float(probe.outlier_term(uniform)) == pytest.approx(math.log(5), rel=1e-6)  # its minimum


def test_fine_tuning_with_outliers_lowers_the_outlier_term_and_without_leaves_it() -> None:
    """Two separable blobs of 'digits' (two classes) and one of outliers: with λ > 0 the head
    ends closer to uniform on the outliers than the same fine-tuning with λ = 0."""
    gen = torch.Generator().manual_seed(1)
    h = torch.cat([torch.randn(256, 8, generator=gen) + 3, torch.randn(256, 8, generator=gen) - 3])
    y = torch.cat([torch.zeros(256), torch.ones(256)]).long()
    h_out = torch.randn(256, 8, generator=gen) * 0.5 + torch.tensor([3.0, -3.0] * 4)
    torch.manual_seed(0)
    head = torch.nn.Sequential(MCDropout(0.1), torch.nn.Linear(8, 16), torch.nn.ReLU(),
                               MCDropout(0.1), torch.nn.Linear(16, 2))  # fmt: skip
    terms = {}
    for lam in (0.0, 2.0):
        tuned = copy.deepcopy(head)
        log = probe.fine_tune(tuned, h, y, h_out, lam, epochs=30, progress=False)
        assert (log[-1]["outlier"] > 0) == (lam > 0)
        with torch.inference_mode():
            terms[lam] = float(probe.outlier_term(probe.head_log_probs(tuned, h_out, 10)))
    assert terms[2.0] < terms[0.0]
    assert terms[2.0] < math.log(2) + 0.1  # near the uniform minimum, log C


def test_a_whole_run_on_a_tiny_cnn(tiny_cnn_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = ["--model", str(tiny_cnn_dir), "--epochs", "1", "--train-limit", "300", "--val-limit",
            "200", "--test-limit", "100", "--lambdas", "0", "1", "--threads", "1", "--no-progress",
            "--json", str(out)]  # fmt: skip
    assert probe.main(args) == 0
    report = json.loads(out.read_text())
    assert set(report["arms"]) == {"bundled", "lambda=0", "lambda=1"}
    for arm in report["arms"].values():
        assert set(arm["flagged"]) == set(probe.OOD)
        assert 0.0 <= arm["clean_fpr_1000"] <= 1.0 and 0.5 < arm["accuracy"] <= 1.0
        assert all(0.0 <= v <= 1.0 for v in arm["flagged"].values())
    assert report["arms"]["lambda=0"]["train_log"][0]["outlier"] == 0.0
    assert report["arms"]["lambda=1"]["train_log"][0]["outlier"] > 0.0
