"""bench/exact_score_refine.py: the loss against its formula, the search against its contract
(monotone, inside the ε-ball and [0, 1]), and a whole run on a tiny model with a detector."""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesgate.attacks.adaptive_eval import EVAL_SEED_OFFSET
from bayesgate.attacks.detector_fit import FitSettings, fit_detector
from bayesgate.models.detection.store import load_detector, save_detector
from bayesgate.models.store.directory import load_model
from tests.bench_scripts import load_bench

refine_bench = load_bench("exact_score_refine")


def test_loss_is_the_adaptive_loss_on_the_exact_score() -> None:
    log_p = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3]], dtype=torch.float64))
    y = torch.tensor([0, 0])
    score = torch.tensor([5.0, 5.0], dtype=torch.float64)
    loss, m = refine_bench.adaptive_loss(log_p, y, score, threshold=3.0)
    m0, m1 = math.log(0.7 / 0.2), math.log(0.2 / 0.5)
    assert m.tolist() == pytest.approx([m0, m1])
    # row 0 still classified right: only the margin term; row 1 misclassified: + λ·(s − t + δ)
    assert loss.tolist() == pytest.approx([m0 + 1.0, max(m1 + 1.0, 0.0) + (5.0 - 3.0 + 0.5)])


def test_the_search_only_accepts_improvements_and_stays_in_the_ball() -> None:
    """A known objective: squared distance to a target image; the best loss never rises, every
    kept image is within ε of x and in [0, 1], and the search makes progress."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(6, 1, 28, 28, generator=gen)
    target = (x + 0.2 * torch.sign(torch.randn(x.shape, generator=gen))).clamp(0, 1)
    calls: list[torch.Tensor] = []

    def objective(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loss = (z - target).flatten(1).pow(2).sum(1)
        calls.append(loss.clone())
        return loss, -loss

    start = x.clone()
    best, best_loss, accepted = refine_bench.refine(objective, x, start, 0.2, 60, p_init=0.05)
    assert float((best - x).abs().max()) <= 0.2 + 1e-6
    assert float(best.min()) >= 0.0 and float(best.max()) <= 1.0
    assert torch.allclose(best_loss, objective(best)[0])
    assert bool((best_loss < calls[0]).all()) and accepted > 0
    assert torch.equal(start, x)  # the start is not modified in place


@pytest.fixture(scope="module")
def detector_dir(tiny_cnn_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = Path(shutil.copytree(tiny_cnn_dir, tmp_path_factory.mktemp("det") / "model"))
    fit = FitSettings(k=5, attacks=("fgs:eta=0.2",), train_subset=600, fit_images=200,
                      threshold_images=200, attack_images=100, kde_per_class=20)  # fmt: skip
    save_detector(fit_detector(load_model(out), fit), out)
    return out


def test_a_whole_run_reproduces_the_start_and_refines(detector_dir: Path, tmp_path: Path) -> None:
    """Start images: the clean digits + noise (as if a cached attack); the 'before' verdict is
    the judge of those images, the after one is no worse for the attacker on the digits refined
    (the search never accepts a higher loss; the verdict is a fresh draw, so this checks counts
    and bounds, not a monotone verdict)."""
    from bayesgate.attacks.adaptive_eval import judge
    from bayesgate.models.data.mnist import load_mnist

    loaded = load_model(detector_dir)
    detector = load_detector(detector_dir, weights_sha256=loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=40)
    noisy = x + 0.3 * torch.sign(torch.randn(x.shape, generator=torch.Generator().manual_seed(1)))
    noisy = noisy.clamp(0, 1)
    images = tmp_path / "start.npz"
    np.savez(images, x_adv=noisy.numpy())
    args = argparse.Namespace(model=detector_dir, eps=0.3, queries=4, draws=1, limit=40, seed=0,
                              images=images, threads=1, json=None, save=tmp_path / "refined.npz",
                              no_progress=True)  # fmt: skip
    result = refine_bench.run(args)
    expected = judge(loaded.network.eval(), detector, noisy, y, detector.k, EVAL_SEED_OFFSET)
    clean = judge(loaded.network.eval(), detector, x, y, detector.k, EVAL_SEED_OFFSET)
    mis = clean["correct"] & ~expected["correct"]
    assert result["before"]["eligible"] == int(clean["correct"].sum())
    assert result["before"]["misclassified"] == int(mis.sum())
    assert result["before"]["through"] == int((mis & ~expected["flagged"]).sum())
    # refined: the eligible digits whose margin under the attacker's own draw is below κ = 1
    rows = torch.arange(40)[torch.from_numpy(clean["correct"])]
    objective = refine_bench.ExactObjective(loaded.network, detector, y[rows], [2_000_000])
    _, margins = objective(noisy[rows])
    assert result["refined_digits"] == int((margins < 1.0).sum())
    assert 0 <= result["after"]["through"] <= result["after"]["misclassified"]
    assert result["after"]["eligible"] == result["before"]["eligible"]
    saved = torch.from_numpy(np.load(tmp_path / "refined.npz")["x_adv"])
    assert saved.shape == x.shape and float((saved - x).abs().max()) <= 0.3 + 1e-6
    after = judge(loaded.network.eval(), detector, saved, y, detector.k, EVAL_SEED_OFFSET)
    assert result["after"]["through"] == int(
        (clean["correct"] & ~after["correct"] & ~after["flagged"]).sum()
    )


def test_from_scratch_searches_every_eligible_digit_from_squares_stripes(
    detector_dir: Path, tmp_path: Path
) -> None:
    """The black-box check: no cached images; the start is Square's stripes (seeded), the
    'before' verdict is theirs, and every digit the clean verdict has right is searched."""
    from bayesgate.attacks.adaptive_eval import judge
    from bayesgate.attacks.methods.square import Square
    from bayesgate.models.data.mnist import load_mnist

    loaded = load_model(detector_dir)
    detector = load_detector(detector_dir, weights_sha256=loaded.card.weights_sha256)
    x, y = load_mnist("test", limit=30)
    args = argparse.Namespace(model=detector_dir, eps=0.2, queries=3, draws=1, limit=30, seed=4,
                              images=None, threads=1, json=None, save=tmp_path / "scratch.npz",
                              no_progress=True, from_scratch=True, p_init=None)  # fmt: skip
    result = refine_bench.run(args)
    start = Square(eps=0.2, queries=3).stripes(x, torch.Generator().manual_seed(4))
    clean = judge(loaded.network.eval(), detector, x, y, detector.k, 4 + EVAL_SEED_OFFSET)
    before = judge(loaded.network.eval(), detector, start, y, detector.k, 4 + EVAL_SEED_OFFSET)
    assert result["from_scratch"] and result["p_init"] == 0.3
    assert result["refined_digits"] == result["before"]["eligible"] == int(clean["correct"].sum())
    assert result["before"]["misclassified"] == int((clean["correct"] & ~before["correct"]).sum())
    saved = torch.from_numpy(np.load(tmp_path / "scratch.npz")["x_adv"])
    assert float((saved - x).abs().max()) <= 0.2 + 1e-6
    assert not saved.equal(start)  # the search moved some digit from its start
