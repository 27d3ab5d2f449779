"""bench/logit_scores_probe.py: the scores against their formulas, and a small whole run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.bench_scripts import load_bench

probe = load_bench("logit_scores_probe")


def test_scores_follow_their_definitions_on_hand_made_logits() -> None:
    # two passes, three classes: every score computed here by hand in float64
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]]], dtype=torch.float64)
    s = {k: float(v) for k, v in probe.logit_scores(logits).items()}
    p = np.exp(logits[0].numpy()) / np.exp(logits[0].numpy()).sum(-1, keepdims=True)
    p_bar = p.mean(0)
    h = -(p_bar * np.log(p_bar)).sum()
    assert s["entropy"] == pytest.approx(h)
    assert s["mutual_information"] == pytest.approx(h + (p * np.log(p)).sum(-1).mean())
    assert s["one_minus_max_p"] == pytest.approx(1 - p_bar.max())
    lse = [math.log(sum(math.exp(v) for v in row)) for row in ([2, 0, -1], [0, 1, 0])]
    assert s["energy_mean"] == pytest.approx(-(lse[0] + lse[1]) / 2)
    assert s["energy_of_mean"] == pytest.approx(-math.log(sum(math.exp(v) for v in (1, 0.5, -0.5))))
    assert s["neg_max_logit"] == pytest.approx(-1.0)


def test_a_small_run_flags_what_its_thresholds_say(tiny_cnn_dir: Path, tmp_path: Path) -> None:
    """Thresholds at 5 % FPR on the validation digits; uniform noise as a stand-in OOD set and
    noisy copies as 'adversarial' examples (only those the network gets wrong count)."""
    from bayesgate.models.data.mnist import load_mnist
    from bayesgate.models.store.directory import load_model

    network = load_model(tiny_cnn_dir).network.eval()
    x_val, _ = load_mnist("val", limit=200)
    x_test, y_test = load_mnist("test", limit=100)
    noise = torch.rand(50, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    noisy = (x_test[:60] + 0.8 * torch.rand(60, 1, 28, 28)).clamp(0, 1)
    result = probe.probe(network, x_val, x_test, y_test, {"noise": noise}, {"noisy": noisy}, k=5)
    assert result["n"]["noise"] == 50 and 0 <= result["n"]["noisy"] <= 60
    for r in result["scores"].values():
        assert 0.0 <= r["clean_test_fpr"] <= 1.0 and set(r["flagged"]) == {"noise", "noisy"}
    # the same thresholds recomputed: entropy of the validation digits at 5 %
    from bayesgate.attacks.metrics import threshold_at_fpr

    val = probe.logit_scores(probe.mc_logits_of(network, x_val, 5, 0))["entropy"].numpy()
    assert result["scores"]["entropy"]["threshold"] == pytest.approx(threshold_at_fpr(val, 0.05))
    text = probe.table(result)
    assert "energy_of_mean" in text and "noisy" in text

    out = tmp_path / "probe.json"
    args = ["--model", str(tiny_cnn_dir), "--k", "3", "--val-limit", "100", "--test-limit", "50",
            "--threads", "1", "--json", str(out)]  # fmt: skip
    assert probe.main(args) == 0
    saved = json.loads(out.read_text())
    assert set(saved["n"]) >= set(probe.OOD)  # no cached attacks for a fresh tiny model
