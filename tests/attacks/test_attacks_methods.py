"""Attacks against a linear softmax model, whose input gradient is known in closed form.

Every attack is called as ``attack(model_fn, x, y, generator=…)`` with ``model_fn`` the network's
MC log-predictive (:func:`log_predictive_fn`); for the deterministic linear net that is
``log softmax(Wx + b)``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from attacks_testnets import LinearNet
from cleverhans.torch.attacks.projected_gradient_descent import projected_gradient_descent

from bayesgate.attacks.methods import CWL2, FGS, PGD, TargetedFGS
from bayesgate.attacks.model_fn import log_predictive_fn
from bayesgate.models.mc.engine import mc_log_predictive
from bayesgate.models.networks.registry import build_network, preset_architecture


def _images(n: int = 6, seed: int = 1) -> torch.Tensor:
    x = torch.rand(n, 1, 4, 4, generator=torch.Generator().manual_seed(seed))
    x[:, 0, 0, :2] = 0.0  # pixels on the box edges exercise the clipping
    x[:, 0, 1, :2] = 1.0
    return x


def _grad_log_softmax(net: LinearNet, x: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """``∇_x log softmax(Wx + b)_cls = W_cls − Σ_c p_c W_c`` in float64, shape B×D."""
    w = net.head.weight.detach().double().numpy()
    b = net.head.bias.detach().double().numpy()
    logits = x @ w.T + b
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return w[cls] - p @ w


def test_fgs_equals_hand_computed_step(linear_net: LinearNet) -> None:
    x = _images()
    eta = 0.07
    flat = x.flatten(1).double().numpy()
    own = (
        flat @ linear_net.head.weight.detach().double().numpy().T
        + linear_net.head.bias.detach().double().numpy()
    ).argmax(1)
    expected = np.clip(flat - eta * np.sign(_grad_log_softmax(linear_net, flat, own)), 0, 1)
    adv = FGS(eta=eta)(log_predictive_fn(linear_net), x)
    assert adv.shape == x.shape
    np.testing.assert_allclose(adv.flatten(1).numpy(), expected, atol=1e-6)
    assert float((adv - x).abs().max()) <= eta + 1e-6


def test_fgs_with_given_labels_and_zero_step(linear_net: LinearNet) -> None:
    x = _images()
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    flat = x.flatten(1).double().numpy()
    expected = np.clip(flat - 0.1 * np.sign(_grad_log_softmax(linear_net, flat, y.numpy())), 0, 1)
    fn = log_predictive_fn(linear_net)
    np.testing.assert_allclose(FGS(eta=0.1)(fn, x, y).flatten(1).numpy(), expected, atol=1e-6)
    assert torch.equal(FGS(eta=0.0)(fn, x), x)


def test_targeted_iterative_equals_hand_iteration(linear_net: LinearNet) -> None:
    x = _images()
    target = torch.tensor([2, 2, 0, 1, 0, 1])
    eta, steps = 0.03, 7
    seen: list[tuple[int, torch.Tensor]] = []
    adv = TargetedFGS(eta=eta, steps=steps)(
        log_predictive_fn(linear_net), x, target, on_step=lambda t, xt: seen.append((t, xt.clone()))
    )
    cur = x.flatten(1).double().numpy()
    assert [t for t, _ in seen] == list(range(steps + 1))
    for t in range(1, steps + 1):
        cur = np.clip(cur + eta * np.sign(_grad_log_softmax(linear_net, cur, target.numpy())), 0, 1)
        np.testing.assert_allclose(seen[t][1].flatten(1).numpy(), cur, atol=1e-5)
        assert float((seen[t][1] - x).abs().max()) <= t * eta + 1e-6
    assert torch.equal(seen[-1][1], adv)
    assert torch.equal(seen[0][1], x)
    # the target's log-probability rises
    before = mc_log_predictive(linear_net, x, 1).gather(1, target[:, None])
    after = mc_log_predictive(linear_net, adv, 1).gather(1, target[:, None])
    assert bool((after > before).all())


def test_stepwise_pgd_equals_one_cleverhans_run_on_a_dropout_net() -> None:
    """Step-by-step PGD (nb_iter=1 from x_{t−1}) = one PGD run with nb_iter=steps, eps=steps·η,
    also with dropout on, given the same mask generator."""
    torch.manual_seed(0)
    arch = preset_architecture("mlp-2x32")
    arch["in_shape"] = [1, 4, 4]
    net = build_network(arch)
    x, target = _images(), torch.tensor([2, 5, 0, 1, 9, 3])
    eta, steps = 0.02, 6
    masks = torch.Generator().manual_seed(3)
    ours = TargetedFGS(eta=eta, steps=steps)(log_predictive_fn(net, 5, generator=masks), x, target)
    fn = log_predictive_fn(net, 5, generator=torch.Generator().manual_seed(3))
    ref = projected_gradient_descent(
        fn,
        x,
        steps * eta,
        eta,
        steps,
        np.inf,
        clip_min=0.0,
        clip_max=1.0,
        y=target,
        targeted=True,
        rand_init=False,
        sanity_checks=False,
    )
    torch.testing.assert_close(ours, ref.detach(), atol=1e-6, rtol=0)
    assert not torch.equal(ours, x)


def test_fgs_on_dropout_net_is_seeded_and_bounded() -> None:
    torch.manual_seed(0)
    arch = preset_architecture("mlp-2x32")
    arch["in_shape"] = [1, 4, 4]
    net = build_network(arch)
    x = _images()

    def run(seed: int) -> torch.Tensor:
        masks = torch.Generator().manual_seed(seed)
        return FGS(eta=0.2)(log_predictive_fn(net, 4, generator=masks), x)

    a, b = run(1), run(1)
    assert torch.equal(a, b)
    assert float((a - x).abs().max()) <= 0.2 + 1e-6
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert any(not torch.equal(run(1), run(s)) for s in range(2, 6))


def test_pgd_stays_in_ball_is_seeded_and_leaves_global_rng(linear_net: LinearNet) -> None:
    x = _images()
    fn, attack = log_predictive_fn(linear_net), PGD(eps=0.1, eps_iter=0.02, steps=5)
    state = torch.random.get_rng_state()
    a = attack(fn, x, generator=torch.Generator().manual_seed(7))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a, attack(fn, x, generator=torch.Generator().manual_seed(7)))
    assert not torch.equal(a, attack(fn, x, generator=torch.Generator().manual_seed(8)))
    # the random start is drawn from the generator: as if torch's global RNG were seeded so
    torch.manual_seed(7)
    ref = projected_gradient_descent(
        fn, x, 0.1, 0.02, 5, np.inf, clip_min=0.0, clip_max=1.0, y=linear_net(x).argmax(1)
    )
    torch.random.set_rng_state(state)
    torch.testing.assert_close(a, ref.detach(), atol=0, rtol=0)
    assert float((a - x).abs().max()) <= 0.1 + 1e-6
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    own = linear_net(x).argmax(1)
    lp = mc_log_predictive(linear_net, x, 1).gather(1, own[:, None])
    lp_adv = mc_log_predictive(linear_net, a, 1).gather(1, own[:, None])
    assert bool((lp_adv < lp).all())  # the predicted class lost probability everywhere


def test_cw_l2_changes_predictions_or_leaves_images_alone(linear_net: LinearNet) -> None:
    x = _images()
    y = linear_net(x).argmax(1)
    adv = CWL2(iterations=60, binary_steps=3, lr=0.1, const=10.0)(log_predictive_fn(linear_net), x)
    changed = (adv - x).flatten(1).abs().amax(1) > 0
    assert bool(changed.any())
    flipped = linear_net(adv).argmax(1) != y
    assert torch.equal(flipped, changed)
    assert float(adv.min()) >= 0.0 and float(adv.max()) <= 1.0


def test_model_function_of_deterministic_net_is_log_softmax(linear_net: LinearNet) -> None:
    x = _images()
    fn = log_predictive_fn(linear_net, 10)
    torch.testing.assert_close(fn(x), torch.log_softmax(linear_net(x), dim=1))
    plain = log_predictive_fn(lambda z: z.flatten(1)[:, :3])  # a callable passes through
    assert plain(x).shape == (6, 3)
    assert math.isclose(float(fn(x).detach().exp().sum(1).mean()), 1.0, rel_tol=1e-6)


def _fn(net: LinearNet):
    return log_predictive_fn(net)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda net, x: FGS(eta=0.1)(_fn(net), x * 2), r"\[0, 1\]"),
        (lambda net, x: FGS(eta=-0.1), "eta"),
        (lambda net, x: FGS(eta=0.1)(_fn(net), x, torch.zeros(2, dtype=torch.int64)), "labels"),
        (lambda net, x: TargetedFGS(eta=0.01, steps=3)(_fn(net), x, torch.zeros(6)), "target"),
        (lambda net, x: TargetedFGS(eta=0.01, steps=3)(_fn(net), x), "targeted"),
        (lambda net, x: TargetedFGS(eta=0.0, steps=3), "eta"),
        (lambda net, x: PGD(eps=0.1, eps_iter=0.2), "eps_iter"),
        (lambda net, x: log_predictive_fn(torch.nn.Linear(2, 2), 3), "trunk"),
    ],
)
def test_bad_arguments(linear_net: LinearNet, call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(linear_net, _images())
