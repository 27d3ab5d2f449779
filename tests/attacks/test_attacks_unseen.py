"""The attacks the detector never sees (PGD, CW-L2, black-box Square, sparse L1 SLIDE) and the OOD
input sets."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from bayesgate.attacks.methods import CWL2, PGD, SLIDE, Square
from bayesgate.attacks.methods.square import margin, p_schedule
from bayesgate.attacks.model_fn import log_predictive_fn
from bayesgate.attacks.ood import OOD_SETS, ood_images, rotate
from bayesgate.attacks.run import mc_predictions, run_attack
from bayesgate.attacks.specs import parse_attack
from bayesgate.models.data.mnist import load_mnist
from bayesgate.models.store.directory import load_model

N_IMAGES = 150


class _NoBackward(torch.autograd.Function):
    """Identity whose backward raises: a model built on it cannot be differentiated."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise AssertionError("backward called on a black-box model")


class _BlackBox:
    """Wraps a network's log-predictive; fails if gradients are enabled or backward is called."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # a plain callable for the attack
        assert not torch.is_grad_enabled(), "the black-box attack queried with autograd on"
        self.calls += 1
        return self.fn(_NoBackward.apply(x))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tiny trained MLP, test images, labels and its K=30 clean predictions."""
    net = load_model(tiny_model_dir).network
    x, y = load_mnist("test", limit=N_IMAGES)
    _, pred = mc_predictions(net, x, 30, seed=1)
    return net, x, y, pred


def _success(net: nn.Module, x_adv: torch.Tensor, y: torch.Tensor, pred: torch.Tensor) -> float:
    """Misclassified after the attack among the correctly classified (fresh masks, K = 30)."""
    _, adv_pred = mc_predictions(net, x_adv, 30, seed=2)
    eligible = pred == y
    return float(((adv_pred != y) & eligible).sum() / eligible.sum())


def _random_signs(x: torch.Tensor, eps: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1
    return (x + eps * signs).clamp(0, 1)


def _random_l2(x: torch.Tensor, norms: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """``x`` plus a random direction of the given per-image L2 norm, clipped."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(x.shape, generator=g)
    d = d / d.flatten(1).norm(dim=1).view(-1, 1, 1, 1) * norms.view(-1, 1, 1, 1)
    return (x + d).clamp(0, 1)


def test_p_schedule_follows_the_reference_halvings() -> None:
    assert p_schedule(0.8, 0, 10_000) == 0.8
    assert p_schedule(0.8, 10, 10_000) == 0.8  # halves only after iteration 10
    assert p_schedule(0.8, 11, 10_000) == 0.4
    assert p_schedule(0.8, 51, 10_000) == 0.2
    assert p_schedule(0.8, 9999, 10_000) == pytest.approx(0.8 / 512)
    assert p_schedule(0.8, 2, 1000) == 0.4  # rescaled: 2/1000 of the budget = iteration 20


def test_margin_by_hand() -> None:
    log_p = torch.tensor([[-0.1, -2.0, -3.0], [-2.0, -0.5, -1.0]])
    m = margin(log_p, torch.tensor([0, 0]))
    assert torch.allclose(m, torch.tensor([-0.1 + 2.0, -2.0 + 0.5]))


def test_square_stays_in_box_and_ball_and_never_differentiates(tiny) -> None:
    net, x, _, pred = tiny
    box = _BlackBox(log_predictive_fn(net, 10, generator=torch.Generator().manual_seed(0)))
    eps = 0.2
    adv = Square(eps=eps, queries=60)(box, x, pred, generator=torch.Generator().manual_seed(3))
    assert adv.shape == x.shape
    assert adv.min() >= 0.0 and adv.max() <= 1.0
    assert (adv - x).abs().max() <= eps + 1e-6
    assert not adv.requires_grad
    assert 1 < box.calls <= 60  # the budget bounds the queries (init + iterations)


def test_square_stops_attacking_once_confidently_misclassified(linear_net) -> None:
    # a deterministic linear net: images already misclassified by margin > κ use one query only
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = linear_net(x)
    wrong = logits.argmin(dim=1)  # "label" = the least likely class: margin ≪ 0 from the start
    box = _BlackBox(lambda z: torch.log_softmax(linear_net(z), dim=1))
    Square(eps=0.01, queries=50, confidence=0.0)(box, x, wrong)
    assert box.calls == 1


def test_square_beats_random_signs_of_the_same_size(tiny) -> None:
    net, x, y, pred = tiny
    eps = 0.25
    model_fn = log_predictive_fn(net, 10, generator=torch.Generator().manual_seed(0))
    adv = Square(eps=eps, queries=100)(
        model_fn, x, pred, generator=torch.Generator().manual_seed(1)
    )
    square, baseline = _success(net, adv, y, pred), _success(net, _random_signs(x, eps), y, pred)
    assert square > baseline + 0.1, (square, baseline)


def test_pgd_beats_random_signs_of_the_same_size(tiny) -> None:
    net, x, y, pred = tiny
    eps = 0.1
    model_fn = log_predictive_fn(net, 10, generator=torch.Generator().manual_seed(0))
    adv = PGD(eps=eps, eps_iter=0.025, steps=20)(model_fn, x, pred)
    assert (adv - x).abs().max() <= eps + 1e-6 and adv.min() >= 0 and adv.max() <= 1
    attacked, baseline = _success(net, adv, y, pred), _success(net, _random_signs(x, eps), y, pred)
    assert attacked > baseline + 0.3, (attacked, baseline)


def test_cw_beats_random_noise_of_the_same_l2_norm(tiny) -> None:
    net, x, y, pred = tiny
    x, y, pred = x[:60], y[:60], pred[:60]
    model_fn = log_predictive_fn(net, 10, generator=torch.Generator().manual_seed(0))
    adv = CWL2(iterations=30, binary_steps=2)(model_fn, x, pred)
    assert adv.min() >= 0 and adv.max() <= 1
    norms = (adv - x).flatten(1).norm(dim=1)
    attacked = _success(net, adv, y, pred)
    baseline = _success(net, _random_l2(x, norms), y, pred)
    assert attacked > baseline + 0.3, (attacked, baseline)


def test_square_through_run_attack_and_spec(tiny) -> None:
    net, x, y, _ = tiny
    attack = parse_attack("square:eps=0.2,queries=20")
    assert attack == Square(eps=0.2, queries=20)
    assert attack.label == "Square ε=0.2, 20 queries"
    assert parse_attack(attack.key) == attack
    outcome = run_attack(net, x[:20], y[:20], attack, k=5, k_eval=10, batch_size=8)
    assert float(outcome.linf.max()) <= 0.2 + 1e-6
    with pytest.raises(ValueError, match="queries"):
        parse_attack("square:queries=0")


@pytest.mark.parametrize("name", sorted(OOD_SETS))
def test_ood_sets_are_images_in_the_unit_box(name: str) -> None:
    x = torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    out = ood_images(name, x, seed=1)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert torch.equal(out, ood_images(name, x, seed=1))  # reproducible


def test_ood_transforms_by_hand() -> None:
    x = torch.zeros(1, 1, 28, 28)
    x[0, 0, 0, 27] = 1.0  # top-right pixel
    assert ood_images("rotated", x)[0, 0, 0, 0] == 1.0  # 90° counter-clockwise → top-left
    assert torch.equal(ood_images("inverted", x), 1.0 - x)
    noise = ood_images("gaussian", torch.zeros(200, 1, 28, 28))
    clipped_low = float((noise == 0).double().mean())
    # P(N(0.5, 0.5²) < 0) = Φ(−1) ≈ 0.1587
    assert clipped_low == pytest.approx(0.1587, abs=0.005)
    uniform = ood_images("uniform", torch.zeros(200, 1, 28, 28))
    assert float(uniform.mean()) == pytest.approx(0.5, abs=0.005)
    with pytest.raises(ValueError, match="unknown OOD set"):
        ood_images("cifar", x)


def test_fresh_ood_transforms_by_hand() -> None:
    """rotated180 = both flips; rotated45 moves a pixel to where the rotation matrix sends it;
    shifted = slicing; the blur of a point is its normalised Gaussian kernel."""
    x = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    assert torch.equal(ood_images("rotated180", x), x.flip(-1).flip(-2))
    # the bilinear rotation turns the same way as torch.rot90 (the "rotated" set)
    torch.testing.assert_close(rotate(x, 90.0), torch.rot90(x, 1, dims=(-2, -1)), rtol=0, atol=1e-5)
    moved = ood_images("shifted", x)
    assert torch.equal(moved[..., 6:, 6:], x[..., :22, :22])
    assert moved[..., :6, :].abs().sum() == 0 and moved[..., :, :6].abs().sum() == 0
    # a 2×2 block right of the centre (13.5, 13.5), rotated 45° counter-clockwise, lands up and
    # right: its centre of mass is at the rotated position
    block = torch.zeros(1, 1, 28, 28)
    block[0, 0, 13:15, 21:23] = 1.0  # centre (row 13.5, col 21.5): offset (dy, dx) = (0, 8)
    out = ood_images("rotated45", block)[0, 0].double()
    rows, cols = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    cy, cx = (rows * out).sum() / out.sum() - 13.5, (cols * out).sum() / out.sum() - 13.5
    c, s = math.cos(math.pi / 4), math.sin(math.pi / 4)
    # counter-clockwise on screen (row axis pointing down): (dx, dy) → (c·dx + s·dy, −s·dx + c·dy)
    assert float(cx) == pytest.approx(c * 8.0, abs=0.05)
    assert float(cy) == pytest.approx(-s * 8.0, abs=0.05)
    point = torch.zeros(1, 1, 28, 28)
    point[0, 0, 14, 14] = 1.0
    blurred = ood_images("blurred", point)[0, 0].double()
    t = torch.arange(-6, 7, dtype=torch.float64)
    g = torch.exp(-(t**2) / 8.0)
    g = g / g.sum()
    torch.testing.assert_close(blurred[8:21, 8:21], torch.outer(g, g), rtol=0, atol=1e-6)


def test_letters_are_centred_mnist_style_glyphs() -> None:
    """52 letters × fonts, ink box ≤ 20 px, centre of mass within a pixel of the frame centre;
    the same seed gives the same images, another seed other rotations."""
    x = torch.zeros(60, 1, 28, 28)
    letters = ood_images("letters", x, seed=0)
    ink = letters[:, 0] > 0.05
    assert bool(ink.flatten(1).any(dim=1).all())
    rows = ink.any(dim=2).float().sum(dim=1)
    cols = ink.any(dim=1).float().sum(dim=1)
    assert int(torch.maximum(rows, cols).max()) <= 21  # 20 px box (+1 for resampling fringe)
    grid = torch.arange(28.0)
    mass = letters[:, 0].sum(dim=(1, 2))
    cy = (letters[:, 0].sum(dim=2) * grid).sum(dim=1) / mass
    cx = (letters[:, 0].sum(dim=1) * grid).sum(dim=1) / mass
    assert float((cy - 13.5).abs().max()) <= 1.0 and float((cx - 13.5).abs().max()) <= 1.0
    assert not torch.equal(letters, ood_images("letters", x, seed=1))
    # image 0 is "A" and image 26 "a": different glyphs
    assert not torch.equal(letters[0], letters[26])


def test_slide_one_step_by_hand() -> None:
    """One SLIDE step on a linear softmax model, against the formula: the gradient of
    ``CE(log_softmax(Wx), y)`` is ``Wᵀ(p − e_y)``; the step moves the pixels whose ``|∇|`` is at
    or above the percentile by ``eps_iter / (their count)`` each, along the gradient's sign
    (pixels at 0 that the gradient would push below 0 are left out first)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(10, 16, generator=g)

    def model_fn(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x.flatten(1) @ w.T, dim=1)

    y = torch.tensor([1, 4, 7])
    w[:, 0] = 0.0
    w[1, 0] = 5.0  # pixel 0's gradient for image 0, (p_1 − 1)·5/3, is large and negative
    x = torch.rand(3, 1, 4, 4, generator=g) * 0.8 + 0.1  # inside (0, 1): no pixel on the box edge
    x[0, 0, 0, 0] = 0.0  # except pixel 0 of image 0, which that gradient pushes out of the box
    adv = SLIDE(eps=5.0, eps_iter=0.4, steps=1, sparsity=75.0)(model_fn, x, y)

    p = torch.softmax(x.flatten(1) @ w.T, dim=1)
    grad = (p - nn.functional.one_hot(y, 10).float()) @ w / 3  # of CE's batch mean
    assert grad[0, 0] < 0 and grad[0, 0].abs() == grad[0].abs().max()
    grad[(x.flatten(1) <= 0) & (grad < 0)] = 0.0  # would leave the box: zeroed
    expected = torch.zeros_like(grad)
    for i in range(3):
        q = grad[i].abs().kthvalue(int(0.75 * 16)).values
        top = grad[i].abs() >= q
        expected[i, top] = grad[i, top].sign() * 0.4 / top.sum()
    torch.testing.assert_close(adv - x, expected.view_as(x), rtol=0, atol=1e-6)


def test_slide_stays_in_box_and_l1_ball_and_changes_few_pixels(tiny) -> None:
    net, x, _, pred = tiny
    x, pred = x[:40], pred[:40]
    eps = 6.0
    model_fn = log_predictive_fn(net, 5, generator=torch.Generator().manual_seed(0))
    adv = SLIDE(eps=eps, eps_iter=1.0, steps=15)(model_fn, x, pred)
    delta = (adv - x).flatten(1)
    assert adv.min() >= 0 and adv.max() <= 1
    assert float(delta.abs().sum(dim=1).max()) <= eps + 1e-4
    # sparse: 15 steps of about 8 pixels (top 1 % of 784) each touch at most ~120 pixels
    changed = (delta.abs() > 1e-6).sum(dim=1)
    assert int(changed.max()) <= 15 * 16, changed.max()


def test_slide_beats_random_sparse_noise_of_the_same_l1_norm(tiny) -> None:
    net, x, y, pred = tiny
    x, y, pred = x[:60], y[:60], pred[:60]
    model_fn = log_predictive_fn(net, 10, generator=torch.Generator().manual_seed(0))
    adv = SLIDE(eps=10.0, eps_iter=1.0, steps=30)(model_fn, x, pred)
    delta = (adv - x).flatten(1)
    # the same number of changed pixels per image, at random places, with the same L1 mass
    g = torch.Generator().manual_seed(5)
    noise = torch.zeros_like(delta)
    for i in range(len(x)):
        n = int((delta[i].abs() > 1e-6).sum())
        where = torch.randperm(delta.shape[1], generator=g)[:n]
        signs = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
        noise[i, where] = signs * delta[i].abs().sum() / max(n, 1)
    baseline = (x + noise.view_as(x)).clamp(0, 1)
    attacked, random = _success(net, adv, y, pred), _success(net, baseline, y, pred)
    assert attacked > random + 0.3, (attacked, random)


def test_slide_through_run_attack_and_spec(tiny) -> None:
    net, x, y, _ = tiny
    attack = parse_attack("slide:eps=4,steps=5")
    assert attack == SLIDE(eps=4.0, steps=5)
    assert attack.label == "SLIDE L1 ε=4" and attack.linf_radius is None
    assert parse_attack(attack.key) == attack
    outcome = run_attack(net, x[:20], y[:20], attack, k=5, k_eval=10, batch_size=8)
    assert float(outcome.l2.max()) > 0
    for bad, named in (("slide:eps_iter=20", "eps_iter"), ("slide:sparsity=100", "sparsity")):
        with pytest.raises(ValueError, match=named):
            parse_attack(bad)
