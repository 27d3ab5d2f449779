"""APGD-CE/DLR and PGD with restarts: feasibility, the DLR formula, the checkpoint schedule,
and APGD at least as strong as PGD of the same budget on a tiny trained model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bayesgate.attacks.losses import cross_entropy_loss, dlr_loss
from bayesgate.attacks.methods import APGD, PGDRestarts
from bayesgate.attacks.methods.apgd import apgd_checkpoints
from bayesgate.attacks.model_fn import log_predictive_fn
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.mc.engine import mc_predict
from bayesgate.models.store.directory import load_model


def test_dlr_matches_the_papers_formula_by_hand() -> None:
    z = torch.tensor([[3.0, 1.0, 0.5, -2.0], [0.0, 4.0, 2.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    # row 0: y the top class, −(3 − 1)/(3 − 0.5); row 1: y second, −(2 − 4)/(4 − 1)
    expected = torch.tensor([-(3 - 1) / (3 - 0.5), -(2 - 4) / (4 - 1)], dtype=torch.float64)
    torch.testing.assert_close(dlr_loss(z, y), expected)


def test_dlr_is_shift_and_scale_invariant_and_ce_is_the_nll() -> None:
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(6, 10, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (6,), generator=gen)
    torch.testing.assert_close(dlr_loss(3.0 * z + 7.0, y), dlr_loss(z, y))
    log_p = torch.log_softmax(z, dim=1)
    torch.testing.assert_close(cross_entropy_loss(log_p, y), -log_p[torch.arange(6), y])


def test_dlr_needs_three_classes() -> None:
    with pytest.raises(ValueError, match="3 classes"):
        dlr_loss(torch.zeros(1, 2), torch.tensor([0]))


def test_checkpoints_follow_the_recursion() -> None:
    # p = 0, .22, .41, .57, .70, .80, .87, .93, .99 (steps .19, .16, .13, .10, .07, then .06)
    assert apgd_checkpoints(100) == [0, 22, 41, 57, 70, 80, 87, 93, 99]
    assert apgd_checkpoints(1000)[:4] == [0, 220, 410, 570]


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_mnist("test", limit=200)
    return x, y


def _success_rate(model: torch.nn.Module, adv: torch.Tensor, y: torch.Tensor) -> float:
    gen = torch.Generator().manual_seed(123)
    probs = mc_predict(model, adv, 30, generator=gen).probs.mean(dim=1)
    return float((probs.argmax(dim=1) != y).double().mean())


@pytest.mark.parametrize("attack", ["apgd-ce", "apgd-dlr", "pgd"])
def test_attacks_stay_in_the_ball_and_the_box(
    attack: str, tiny_model_dir: Path, digits: tuple[torch.Tensor, torch.Tensor]
) -> None:
    net = load_model(tiny_model_dir).network
    x, y = digits[0][:40], digits[1][:40]
    gen = torch.Generator().manual_seed(0)
    eps = 0.1
    if attack == "pgd":
        attack = PGDRestarts(eps=eps, eps_iter=eps / 4, steps=10, restarts=2)
    else:
        attack = APGD(eps=eps, steps=20, loss=attack[5:])
    adv = attack(log_predictive_fn(net, 5, generator=gen), x, y, generator=gen)
    assert adv.shape == x.shape
    assert float((adv - x).abs().max()) <= eps + 1e-6
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0
    assert _success_rate(net, adv, y) > _success_rate(net, x, y)  # it does attack


def test_apgd_at_least_as_strong_as_pgd_of_the_same_budget(
    tiny_model_dir: Path, digits: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """Same number of gradient queries; PGD gets the usual step 2.5·ε/steps (so it too can
    cross the ball); success rates pooled over two seeds of starts and masks."""
    net = load_model(tiny_model_dir).network
    x, y = digits
    eps, budget = 0.06, 20
    pgd_rate = apgd_rate = 0.0
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        fn = log_predictive_fn(net, 5, generator=gen)
        pgd = PGDRestarts(eps=eps, eps_iter=2.5 * eps / budget, steps=budget, restarts=1)
        pgd_adv = pgd(fn, x, y, generator=gen)
        gen = torch.Generator().manual_seed(seed)
        fn = log_predictive_fn(net, 5, generator=gen)
        apgd_adv = APGD(eps=eps, steps=budget)(fn, x, y, generator=gen)
        pgd_rate += _success_rate(net, pgd_adv, y) / 2
        apgd_rate += _success_rate(net, apgd_adv, y) / 2
    clean_rate = _success_rate(net, x, y)
    assert (
        clean_rate < pgd_rate < 1.0
    )  # PGD works and is not saturated: the comparison means something
    assert apgd_rate >= pgd_rate, (apgd_rate, pgd_rate)


def test_apgd_rejects_an_unknown_loss() -> None:
    with pytest.raises(ValueError, match="apgd loss must be one of ce, dlr"):
        APGD(loss="hinge")
